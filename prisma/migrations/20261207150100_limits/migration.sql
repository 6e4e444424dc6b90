-- AlterTable
ALTER TABLE "ApiToken" ADD COLUMN "batch" BOOLEAN NOT NULL DEFAULT false;

-- CreateTable
CREATE TABLE "Limit" (
    "id" UUID NOT NULL,
    "scope" TEXT NOT NULL,
    "model" TEXT NOT NULL DEFAULT '',
    "requestsPerMinute" INTEGER,
    "tokensPerMinute" INTEGER,
    "concurrentRequests" INTEGER,
    "tokensPerDay" BIGINT,
    "tokensPerMonth" BIGINT,
    "spendPerMonth" DECIMAL(14,2),
    "declared" BOOLEAN NOT NULL DEFAULT false,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "Limit_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "LimitWindow" (
    "limitId" UUID NOT NULL,
    "kind" TEXT NOT NULL,
    "start" TIMESTAMP(3) NOT NULL,
    "used" BIGINT NOT NULL DEFAULT 0,
    "leased" BIGINT NOT NULL DEFAULT 0,

    CONSTRAINT "LimitWindow_pkey" PRIMARY KEY ("limitId","kind","start")
);

-- CreateIndex
CREATE UNIQUE INDEX "Limit_scope_model_key" ON "Limit"("scope", "model");

-- CreateIndex
CREATE INDEX "LimitWindow_start_idx" ON "LimitWindow"("start");
