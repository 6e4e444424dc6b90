-- CreateTable
CREATE TABLE "HubRef" (
    "repo" TEXT NOT NULL,
    "ref" TEXT NOT NULL,
    "commit" TEXT NOT NULL,
    "at" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "HubRef_pkey" PRIMARY KEY ("repo","ref","commit")
);
