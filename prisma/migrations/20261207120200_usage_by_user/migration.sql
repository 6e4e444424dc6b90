-- DropIndex
DROP INDEX "UsageMinute_minute_tokenId_model_adapter_replicaId_key";

-- CreateTable
CREATE TABLE "UsageSpool" (
    "generation" TEXT NOT NULL,
    "appliedSeq" INTEGER NOT NULL DEFAULT 0,
    "updatedAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "UsageSpool_pkey" PRIMARY KEY ("generation")
);

-- CreateIndex
CREATE UNIQUE INDEX "UsageMinute_minute_tokenId_userId_model_adapter_replicaId_key" ON "UsageMinute"("minute", "tokenId", "userId", "model", "adapter", "replicaId");
