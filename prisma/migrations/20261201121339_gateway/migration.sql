-- AlterTable
ALTER TABLE "ApiToken" ADD COLUMN     "callerOnly" BOOLEAN NOT NULL DEFAULT false;

-- AlterTable
ALTER TABLE "CatalogModel" ADD COLUMN     "lastRequestAt" TIMESTAMP(3),
ADD COLUMN     "owner" TEXT;

-- AlterTable
ALTER TABLE "Replica" ADD COLUMN     "adapters" TEXT[] DEFAULT ARRAY[]::TEXT[];

-- CreateTable
CREATE TABLE "UsageMinute" (
    "id" BIGSERIAL NOT NULL,
    "minute" TIMESTAMP(3) NOT NULL,
    "tokenId" TEXT NOT NULL DEFAULT '',
    "userId" TEXT NOT NULL DEFAULT '',
    "model" TEXT NOT NULL,
    "adapter" TEXT NOT NULL DEFAULT '',
    "node" TEXT NOT NULL DEFAULT '',
    "replicaId" TEXT NOT NULL DEFAULT '',
    "requests" INTEGER NOT NULL DEFAULT 0,
    "errors" INTEGER NOT NULL DEFAULT 0,
    "aborted" INTEGER NOT NULL DEFAULT 0,
    "promptTokens" BIGINT NOT NULL DEFAULT 0,
    "completionTokens" BIGINT NOT NULL DEFAULT 0,
    "ttftMsSum" DOUBLE PRECISION NOT NULL DEFAULT 0,
    "ttftCount" INTEGER NOT NULL DEFAULT 0,
    "durationMsSum" DOUBLE PRECISION NOT NULL DEFAULT 0,
    "durationBuckets" INTEGER[] DEFAULT ARRAY[]::INTEGER[],

    CONSTRAINT "UsageMinute_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "UsageMinute_model_minute_idx" ON "UsageMinute"("model", "minute");

-- CreateIndex
CREATE INDEX "UsageMinute_tokenId_minute_idx" ON "UsageMinute"("tokenId", "minute");

-- CreateIndex
CREATE UNIQUE INDEX "UsageMinute_minute_tokenId_model_adapter_replicaId_key" ON "UsageMinute"("minute", "tokenId", "model", "adapter", "replicaId");
