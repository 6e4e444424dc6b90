-- CreateEnum
CREATE TYPE "ServedNameKind" AS ENUM ('MODEL', 'ADAPTER');

-- CreateTable
CREATE TABLE "ServedName" (
    "name" TEXT NOT NULL,
    "kind" "ServedNameKind" NOT NULL,
    "modelId" UUID,
    "adapterId" UUID,

    CONSTRAINT "ServedName_pkey" PRIMARY KEY ("name")
);

-- CreateIndex
CREATE UNIQUE INDEX "ServedName_modelId_key" ON "ServedName"("modelId");

-- CreateIndex
CREATE UNIQUE INDEX "ServedName_adapterId_key" ON "ServedName"("adapterId");

-- AddForeignKey
ALTER TABLE "ServedName" ADD CONSTRAINT "ServedName_modelId_fkey" FOREIGN KEY ("modelId") REFERENCES "CatalogModel"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "ServedName" ADD CONSTRAINT "ServedName_adapterId_fkey" FOREIGN KEY ("adapterId") REFERENCES "Adapter"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- Backfill. Every adapter keeps its name, and a model keeps its own unless an adapter holds it too. Before this
-- table, such a clash was made only by serving a model under an adapter's name (the hijack this closes) or by a
-- hangar.yaml entry, so the model gives the name up: requests for the name reach the adapter, the model row stays
-- (with its replicas) but is called by no name, and the audit log says which model and what to do.
INSERT INTO "ServedName" ("name", "kind", "adapterId")
SELECT "name", 'ADAPTER', "id" FROM "Adapter";

INSERT INTO "ServedName" ("name", "kind", "modelId")
SELECT m."name", 'MODEL', m."id" FROM "CatalogModel" m
WHERE NOT EXISTS (SELECT 1 FROM "Adapter" a WHERE a."name" = m."name");

INSERT INTO "AuditEvent" ("actor", "action", "target", "outcome", "message")
SELECT 'system:migration', 'servedNameClash', m."name", 'DONE',
    'a model and an adapter both had this name: the adapter keeps it and requests for it go to the adapter. The model (id '
    || m."id"::text || ') is no longer called by it: remove it and serve it again under another name'
FROM "CatalogModel" m JOIN "Adapter" a ON a."name" = m."name";
