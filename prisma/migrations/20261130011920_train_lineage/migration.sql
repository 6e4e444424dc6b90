-- AlterTable
ALTER TABLE "Adapter" ADD COLUMN     "artifactSha256" TEXT;

-- AlterTable
ALTER TABLE "TrainArtifact" ADD COLUMN     "files" JSONB;

-- AlterTable
ALTER TABLE "TrainJob" ADD COLUMN     "cancelRequestedAt" TIMESTAMP(3),
ADD COLUMN     "dataBytes" INTEGER NOT NULL,
ADD COLUMN     "dataSha256" TEXT NOT NULL;
