-- AlterEnum
ALTER TYPE "MirrorFileState" ADD VALUE 'PAUSED';

-- AlterTable
ALTER TABLE "MirrorFile" ADD COLUMN     "retryAt" TIMESTAMP(3),
ADD COLUMN     "retryAttempt" INTEGER,
ADD COLUMN     "retryReason" TEXT;
