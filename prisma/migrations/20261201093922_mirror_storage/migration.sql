-- Existing rows keep NULL, "recorded before storages had ids": the first replica to start with a storage id
-- adopts them (MirrorService.openStorage). No guess is made here, where the files cannot be seen.
-- AlterTable
ALTER TABLE "MirrorFile" ADD COLUMN     "storageId" TEXT;
