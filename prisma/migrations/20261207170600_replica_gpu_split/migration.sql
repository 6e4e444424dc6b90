-- AlterTable
ALTER TABLE "Replica" ADD COLUMN     "gpuIndexes" INTEGER[] DEFAULT ARRAY[]::INTEGER[];
