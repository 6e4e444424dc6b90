-- AlterTable
ALTER TABLE "Node" ADD COLUMN     "leftAt" TIMESTAMP(3),
ADD COLUMN     "tokenChangedAt" TIMESTAMP(3),
ADD COLUMN     "tokenRevokedAt" TIMESTAMP(3);

-- AlterTable
ALTER TABLE "Replica" ADD COLUMN     "gpuIndex" INTEGER;
