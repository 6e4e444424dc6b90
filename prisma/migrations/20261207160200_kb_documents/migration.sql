-- CreateTable
CREATE TABLE "CollectionDocument" (
    "id" UUID NOT NULL,
    "collectionId" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "mediaType" TEXT NOT NULL,
    "bytes" INTEGER NOT NULL,
    "sha256" TEXT NOT NULL,
    "text" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "CollectionDocument_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "KbDataset" (
    "id" UUID NOT NULL,
    "collectionId" UUID NOT NULL,
    "model" TEXT NOT NULL,
    "state" TEXT NOT NULL DEFAULT 'RUNNING',
    "chunks" INTEGER NOT NULL,
    "chunksDone" INTEGER NOT NULL DEFAULT 0,
    "pairs" INTEGER NOT NULL DEFAULT 0,
    "documents" JSONB NOT NULL,
    "notes" TEXT[] DEFAULT ARRAY[]::TEXT[],
    "error" TEXT,
    "dataSha256" TEXT,
    "createdBy" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "finishedAt" TIMESTAMP(3),

    CONSTRAINT "KbDataset_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "KbDataset_dataSha256_idx" ON "KbDataset"("dataSha256");

-- CreateIndex
CREATE UNIQUE INDEX "CollectionDocument_collectionId_name_key" ON "CollectionDocument"("collectionId", "name");

-- AddForeignKey
ALTER TABLE "CollectionDocument" ADD CONSTRAINT "CollectionDocument_collectionId_fkey" FOREIGN KEY ("collectionId") REFERENCES "Collection"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "KbDataset" ADD CONSTRAINT "KbDataset_collectionId_fkey" FOREIGN KEY ("collectionId") REFERENCES "Collection"("id") ON DELETE CASCADE ON UPDATE CASCADE;
