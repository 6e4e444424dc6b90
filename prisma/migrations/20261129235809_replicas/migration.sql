-- CreateEnum
CREATE TYPE "ReplicaDesired" AS ENUM ('RUN', 'STOP');

-- AlterTable
ALTER TABLE "CatalogModel" ADD COLUMN     "awakeUntil" TIMESTAMP(3);

-- AlterTable
ALTER TABLE "Replica" ADD COLUMN     "desired" "ReplicaDesired" NOT NULL DEFAULT 'RUN',
ADD COLUMN     "smokeText" TEXT,
ADD COLUMN     "tokensPerSecond" DOUBLE PRECISION;
