-- AlterTable
ALTER TABLE "TrainJob" ADD COLUMN     "evalShare" DOUBLE PRECISION NOT NULL DEFAULT 0.1,
ADD COLUMN     "evalSeed" INTEGER NOT NULL DEFAULT 0,
ADD COLUMN     "heldOutLines" INTEGER[] DEFAULT ARRAY[]::INTEGER[],
ADD COLUMN     "evalDataSha256" TEXT;

-- AlterTable
ALTER TABLE "TrainMetric" ADD COLUMN     "evalLoss" DOUBLE PRECISION;

-- CreateTable
CREATE TABLE "TrainEvaluation" (
    "jobId" UUID NOT NULL,
    "heldOut" INTEGER NOT NULL,
    "seed" INTEGER NOT NULL,
    "verdict" TEXT NOT NULL,
    "forgettingVerdict" TEXT NOT NULL,
    "metrics" JSONB NOT NULL,
    "questions" JSONB NOT NULL,
    "published" BOOLEAN NOT NULL DEFAULT false,
    "at" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "TrainEvaluation_pkey" PRIMARY KEY ("jobId")
);
