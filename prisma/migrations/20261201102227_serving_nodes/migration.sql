-- AlterTable
ALTER TABLE "CatalogModel" ADD COLUMN     "measuredAt" TIMESTAMP(3),
ADD COLUMN     "measuredMemoryBytes" BIGINT,
ADD COLUMN     "parallel" INTEGER NOT NULL DEFAULT 1;

-- AlterTable
ALTER TABLE "Replica" ADD COLUMN     "gpuLayers" INTEGER,
ADD COLUMN     "servingAt" TIMESTAMP(3),
ADD COLUMN     "smokeLeaseUntil" TIMESTAMP(3),
ADD COLUMN     "smokedAt" TIMESTAMP(3),
ADD COLUMN     "timeToFirstTokenMs" DOUBLE PRECISION,
ADD COLUMN     "totalLayers" INTEGER,
ADD COLUMN     "vramUsedBytes" BIGINT;

-- CreateTable
CREATE TABLE "EngineKey" (
    "replicaId" UUID NOT NULL,
    "key" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "EngineKey_pkey" PRIMARY KEY ("replicaId")
);

-- AddForeignKey
ALTER TABLE "EngineKey" ADD CONSTRAINT "EngineKey_replicaId_fkey" FOREIGN KEY ("replicaId") REFERENCES "Replica"("id") ON DELETE CASCADE ON UPDATE CASCADE;
