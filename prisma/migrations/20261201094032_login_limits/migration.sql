-- AlterTable
ALTER TABLE "AuditEvent" ADD COLUMN     "coalesceKey" TEXT,
ADD COLUMN     "repeats" INTEGER NOT NULL DEFAULT 1;

-- CreateTable
CREATE TABLE "LoginLimit" (
    "key" VARCHAR(255) NOT NULL,
    "points" INTEGER NOT NULL DEFAULT 0,
    "expire" BIGINT,

    CONSTRAINT "LoginLimit_pkey" PRIMARY KEY ("key")
);

-- CreateIndex
CREATE UNIQUE INDEX "AuditEvent_coalesceKey_key" ON "AuditEvent"("coalesceKey");

