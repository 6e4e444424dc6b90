-- AlterTable
ALTER TABLE "MirrorFile" ADD COLUMN     "architecture" TEXT,
ADD COLUMN     "kind" TEXT;
