-- CreateTable
CREATE TABLE "NodeFile" (
    "nodeId" UUID NOT NULL,
    "sha256" TEXT NOT NULL,
    "bytes" BIGINT NOT NULL,
    "held" BOOLEAN NOT NULL,
    "since" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "NodeFile_pkey" PRIMARY KEY ("nodeId","sha256")
);

-- CreateTable
CREATE TABLE "NodePeer" (
    "nodeId" UUID NOT NULL,
    "url" TEXT,
    "key" TEXT NOT NULL,
    "mirrorBytes" BIGINT NOT NULL DEFAULT 0,
    "peerBytes" BIGINT NOT NULL DEFAULT 0,
    "reportedAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "NodePeer_pkey" PRIMARY KEY ("nodeId")
);

-- CreateIndex
CREATE INDEX "NodeFile_sha256_idx" ON "NodeFile"("sha256");

-- AddForeignKey
ALTER TABLE "NodeFile" ADD CONSTRAINT "NodeFile_nodeId_fkey" FOREIGN KEY ("nodeId") REFERENCES "Node"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "NodePeer" ADD CONSTRAINT "NodePeer_nodeId_fkey" FOREIGN KEY ("nodeId") REFERENCES "Node"("id") ON DELETE CASCADE ON UPDATE CASCADE;
