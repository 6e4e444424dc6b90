-- The held-copy lookup and the blob-removal check find rows by the sha256 they hold.
CREATE INDEX "MirrorFile_actualSha256_idx" ON "MirrorFile"("actualSha256");
