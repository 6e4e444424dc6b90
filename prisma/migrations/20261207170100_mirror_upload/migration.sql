-- CreateTable
CREATE TABLE "MirrorUpload" (
    "id" TEXT NOT NULL,
    "key" TEXT NOT NULL,
    "uploadId" TEXT NOT NULL,
    "bytesDone" BIGINT NOT NULL DEFAULT 0,
    "hashState" BYTEA,
    "parts" JSONB NOT NULL DEFAULT '[]',
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "MirrorUpload_pkey" PRIMARY KEY ("id")
);
