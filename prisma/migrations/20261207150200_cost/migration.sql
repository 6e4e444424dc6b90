-- CreateEnum
CREATE TYPE "PriceTarget" AS ENUM ('NODE', 'GPU', 'MODEL');

-- CreateTable
CREATE TABLE "Price" (
    "id" UUID NOT NULL,
    "target" "PriceTarget" NOT NULL,
    "name" TEXT NOT NULL,
    "perGpuHour" DECIMAL(18,6),
    "perMillionPromptTokens" DECIMAL(18,6),
    "perMillionCompletionTokens" DECIMAL(18,6),
    "declared" BOOLEAN NOT NULL DEFAULT false,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "Price_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "GpuTime" (
    "id" BIGSERIAL NOT NULL,
    "replicaId" UUID NOT NULL,
    "modelId" UUID NOT NULL,
    "node" TEXT NOT NULL,
    "gpuName" TEXT NOT NULL DEFAULT '',
    "gpus" INTEGER NOT NULL,
    "startedAt" TIMESTAMP(3) NOT NULL,
    "endedAt" TIMESTAMP(3),

    CONSTRAINT "GpuTime_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE UNIQUE INDEX "Price_target_name_key" ON "Price"("target", "name");

-- CreateIndex
CREATE INDEX "GpuTime_replicaId_idx" ON "GpuTime"("replicaId");

-- CreateIndex
CREATE INDEX "GpuTime_startedAt_idx" ON "GpuTime"("startedAt");

-- CreateIndex
CREATE INDEX "GpuTime_endedAt_idx" ON "GpuTime"("endedAt");
