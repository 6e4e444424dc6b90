-- AlterTable
ALTER TABLE "MirrorFile" ADD COLUMN     "bytesPerSecond" DOUBLE PRECISION;
