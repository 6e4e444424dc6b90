-- AlterTable
ALTER TABLE "CatalogModel" ADD COLUMN     "targetInFlight" DOUBLE PRECISION;

-- AlterTable
ALTER TABLE "Replica" ADD COLUMN     "drainingSince" TIMESTAMP(3);

-- CreateTable
CREATE TABLE "ModelScale" (
    "modelId" UUID NOT NULL,
    "replicas" INTEGER NOT NULL,
    "trend" TEXT,
    "trendSince" TIMESTAMP(3),
    "trendSum" DOUBLE PRECISION NOT NULL DEFAULT 0,
    "trendSamples" INTEGER NOT NULL DEFAULT 0,
    "sampledAt" TIMESTAMP(3),
    "updatedAt" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "ModelScale_pkey" PRIMARY KEY ("modelId")
);

-- CreateTable
CREATE TABLE "GatewayLoad" (
    "server" TEXT NOT NULL,
    "replicas" JSONB NOT NULL DEFAULT '{}',
    "queued" JSONB NOT NULL DEFAULT '{}',
    "at" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "GatewayLoad_pkey" PRIMARY KEY ("server")
);

-- AddForeignKey
ALTER TABLE "ModelScale" ADD CONSTRAINT "ModelScale_modelId_fkey" FOREIGN KEY ("modelId") REFERENCES "CatalogModel"("id") ON DELETE CASCADE ON UPDATE CASCADE;
