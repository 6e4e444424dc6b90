-- AlterTable
ALTER TABLE "AuditEvent" ADD COLUMN     "owner" TEXT;
