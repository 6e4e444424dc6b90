-- CreateEnum
CREATE TYPE "Role" AS ENUM ('ADMIN', 'OPERATOR', 'VIEWER');

-- CreateEnum
CREATE TYPE "MirrorFileState" AS ENUM ('QUEUED', 'FETCHING', 'VERIFYING', 'PRESENT', 'FAILED', 'CANCELLED');

-- CreateEnum
CREATE TYPE "Engine" AS ENUM ('llamacpp', 'vllm');

-- CreateEnum
CREATE TYPE "ReplicaState" AS ENUM ('PENDING', 'LOADING', 'READY', 'FAILED', 'STOPPED', 'LOST');

-- CreateEnum
CREATE TYPE "JobState" AS ENUM ('QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED');

-- CreateEnum
CREATE TYPE "ArtifactKind" AS ENUM ('peft', 'gguf');

-- CreateEnum
CREATE TYPE "OwnerScope" AS ENUM ('org', 'team', 'project', 'user', 'key');

-- CreateEnum
CREATE TYPE "AuditOutcome" AS ENUM ('DONE', 'REFUSED', 'FAILED');

-- CreateTable
CREATE TABLE "User" (
    "id" UUID NOT NULL,
    "email" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "role" "Role" NOT NULL,
    "passwordHash" TEXT NOT NULL,
    "disabledAt" TIMESTAMP(3),
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "User_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Session" (
    "id" UUID NOT NULL,
    "tokenHash" TEXT NOT NULL,
    "csrfToken" TEXT NOT NULL,
    "userId" UUID NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "expiresAt" TIMESTAMP(3) NOT NULL,
    "lastSeenAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "userAgent" TEXT,

    CONSTRAINT "Session_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "ApiToken" (
    "id" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "prefix" TEXT NOT NULL,
    "tokenHash" TEXT NOT NULL,
    "role" "Role" NOT NULL,
    "userId" UUID NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "expiresAt" TIMESTAMP(3),
    "lastUsedAt" TIMESTAMP(3),
    "revokedAt" TIMESTAMP(3),

    CONSTRAINT "ApiToken_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Node" (
    "id" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "tokenHash" TEXT NOT NULL,
    "gpus" JSONB NOT NULL DEFAULT '[]',
    "engines" JSONB NOT NULL DEFAULT '[]',
    "diskFreeBytes" BIGINT,
    "agentVersion" TEXT,
    "lastSeenAt" TIMESTAMP(3),
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "Node_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "MirrorFile" (
    "id" UUID NOT NULL,
    "model" TEXT NOT NULL,
    "version" TEXT NOT NULL,
    "file" TEXT NOT NULL,
    "sourceUrl" TEXT NOT NULL,
    "state" "MirrorFileState" NOT NULL DEFAULT 'QUEUED',
    "bytesDone" BIGINT NOT NULL DEFAULT 0,
    "bytesTotal" BIGINT,
    "expectedSha256" TEXT,
    "actualSha256" TEXT,
    "etag" TEXT,
    "error" TEXT,
    "attempts" INTEGER NOT NULL DEFAULT 0,
    "leaseOwner" TEXT,
    "leaseUntil" TIMESTAMP(3),
    "requestedBy" TEXT,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,
    "startedAt" TIMESTAMP(3),
    "finishedAt" TIMESTAMP(3),

    CONSTRAINT "MirrorFile_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "CatalogModel" (
    "id" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "source" TEXT NOT NULL,
    "engine" "Engine" NOT NULL,
    "profile" JSONB NOT NULL DEFAULT '{}',
    "contextSize" INTEGER,
    "memoryBytes" BIGINT,
    "minReplicas" INTEGER NOT NULL DEFAULT 1,
    "maxReplicas" INTEGER NOT NULL DEFAULT 1,
    "idleSeconds" INTEGER NOT NULL DEFAULT 900,
    "declared" BOOLEAN NOT NULL DEFAULT false,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "CatalogModel_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Adapter" (
    "id" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "source" TEXT NOT NULL,
    "owner" TEXT,
    "modelId" UUID NOT NULL,
    "trainJobId" UUID,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "Adapter_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Replica" (
    "id" UUID NOT NULL,
    "modelId" UUID NOT NULL,
    "nodeId" UUID,
    "state" "ReplicaState" NOT NULL DEFAULT 'PENDING',
    "message" TEXT,
    "endpoint" TEXT,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,

    CONSTRAINT "Replica_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "ServeJob" (
    "id" UUID NOT NULL,
    "repo" TEXT NOT NULL,
    "revision" TEXT,
    "quant" TEXT,
    "file" TEXT,
    "onDemand" BOOLEAN NOT NULL DEFAULT false,
    "model" TEXT,
    "state" "JobState" NOT NULL DEFAULT 'QUEUED',
    "message" TEXT,
    "leaseOwner" TEXT,
    "leaseUntil" TIMESTAMP(3),
    "createdBy" TEXT,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,
    "finishedAt" TIMESTAMP(3),

    CONSTRAINT "ServeJob_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "ServeJobStep" (
    "id" UUID NOT NULL,
    "jobId" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "position" INTEGER NOT NULL,
    "state" "JobState" NOT NULL DEFAULT 'QUEUED',
    "message" TEXT,
    "detail" JSONB,
    "startedAt" TIMESTAMP(3),
    "finishedAt" TIMESTAMP(3),

    CONSTRAINT "ServeJobStep_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "TrainJob" (
    "id" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "model" TEXT NOT NULL,
    "baseRepo" TEXT NOT NULL,
    "baseRevision" TEXT,
    "nodeId" UUID,
    "owner" TEXT,
    "gpuMiB" INTEGER NOT NULL,
    "params" JSONB NOT NULL DEFAULT '{}',
    "gguf" BOOLEAN NOT NULL DEFAULT true,
    "dataPath" TEXT NOT NULL,
    "pairs" INTEGER NOT NULL,
    "state" "JobState" NOT NULL DEFAULT 'QUEUED',
    "step" INTEGER NOT NULL DEFAULT 0,
    "steps" INTEGER NOT NULL DEFAULT 0,
    "loss" DOUBLE PRECISION,
    "message" TEXT,
    "peakMiB" INTEGER,
    "leaseOwner" TEXT,
    "leaseUntil" TIMESTAMP(3),
    "createdById" UUID,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" TIMESTAMP(3) NOT NULL,
    "startedAt" TIMESTAMP(3),
    "finishedAt" TIMESTAMP(3),

    CONSTRAINT "TrainJob_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "TrainMetric" (
    "id" UUID NOT NULL,
    "jobId" UUID NOT NULL,
    "step" INTEGER NOT NULL,
    "loss" DOUBLE PRECISION NOT NULL,
    "lr" DOUBLE PRECISION,
    "peakMiB" INTEGER,
    "tokensPerS" DOUBLE PRECISION,
    "at" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "TrainMetric_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "TrainEvent" (
    "id" UUID NOT NULL,
    "jobId" UUID NOT NULL,
    "level" TEXT NOT NULL,
    "message" TEXT NOT NULL,
    "at" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "TrainEvent_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "TrainArtifact" (
    "id" UUID NOT NULL,
    "jobId" UUID NOT NULL,
    "kind" "ArtifactKind" NOT NULL,
    "size" BIGINT NOT NULL,
    "sha256" TEXT NOT NULL,
    "path" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "TrainArtifact_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Org" (
    "id" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "Org_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Team" (
    "id" UUID NOT NULL,
    "orgId" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "Team_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Project" (
    "id" UUID NOT NULL,
    "teamId" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "Project_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Membership" (
    "id" UUID NOT NULL,
    "orgId" UUID NOT NULL,
    "teamId" UUID,
    "projectId" UUID,
    "userId" UUID,
    "apiTokenId" UUID,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "Membership_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "Collection" (
    "id" UUID NOT NULL,
    "name" TEXT NOT NULL,
    "ownerScope" "OwnerScope" NOT NULL,
    "ownerId" TEXT NOT NULL,
    "orgId" UUID NOT NULL,
    "createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "Collection_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "AuditEvent" (
    "id" BIGSERIAL NOT NULL,
    "at" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "actor" TEXT NOT NULL,
    "action" TEXT NOT NULL,
    "target" TEXT,
    "outcome" "AuditOutcome" NOT NULL,
    "message" TEXT,
    "requestId" TEXT,

    CONSTRAINT "AuditEvent_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE UNIQUE INDEX "User_email_key" ON "User"("email");

-- CreateIndex
CREATE UNIQUE INDEX "Session_tokenHash_key" ON "Session"("tokenHash");

-- CreateIndex
CREATE INDEX "Session_userId_idx" ON "Session"("userId");

-- CreateIndex
CREATE UNIQUE INDEX "ApiToken_tokenHash_key" ON "ApiToken"("tokenHash");

-- CreateIndex
CREATE INDEX "ApiToken_userId_idx" ON "ApiToken"("userId");

-- CreateIndex
CREATE UNIQUE INDEX "Node_name_key" ON "Node"("name");

-- CreateIndex
CREATE UNIQUE INDEX "Node_tokenHash_key" ON "Node"("tokenHash");

-- CreateIndex
CREATE INDEX "MirrorFile_state_idx" ON "MirrorFile"("state");

-- CreateIndex
CREATE UNIQUE INDEX "MirrorFile_model_version_file_key" ON "MirrorFile"("model", "version", "file");

-- CreateIndex
CREATE UNIQUE INDEX "CatalogModel_name_key" ON "CatalogModel"("name");

-- CreateIndex
CREATE UNIQUE INDEX "Adapter_name_key" ON "Adapter"("name");

-- CreateIndex
CREATE INDEX "Replica_modelId_idx" ON "Replica"("modelId");

-- CreateIndex
CREATE INDEX "Replica_nodeId_idx" ON "Replica"("nodeId");

-- CreateIndex
CREATE UNIQUE INDEX "ServeJobStep_jobId_name_key" ON "ServeJobStep"("jobId", "name");

-- CreateIndex
CREATE INDEX "TrainJob_state_idx" ON "TrainJob"("state");

-- CreateIndex
CREATE UNIQUE INDEX "TrainMetric_jobId_step_key" ON "TrainMetric"("jobId", "step");

-- CreateIndex
CREATE INDEX "TrainEvent_jobId_at_idx" ON "TrainEvent"("jobId", "at");

-- CreateIndex
CREATE UNIQUE INDEX "TrainArtifact_jobId_kind_key" ON "TrainArtifact"("jobId", "kind");

-- CreateIndex
CREATE UNIQUE INDEX "Org_name_key" ON "Org"("name");

-- CreateIndex
CREATE UNIQUE INDEX "Team_orgId_name_key" ON "Team"("orgId", "name");

-- CreateIndex
CREATE UNIQUE INDEX "Project_teamId_name_key" ON "Project"("teamId", "name");

-- CreateIndex
CREATE INDEX "Membership_userId_idx" ON "Membership"("userId");

-- CreateIndex
CREATE INDEX "Membership_apiTokenId_idx" ON "Membership"("apiTokenId");

-- CreateIndex
CREATE UNIQUE INDEX "Collection_orgId_name_key" ON "Collection"("orgId", "name");

-- CreateIndex
CREATE INDEX "AuditEvent_at_idx" ON "AuditEvent"("at");

-- AddForeignKey
ALTER TABLE "Session" ADD CONSTRAINT "Session_userId_fkey" FOREIGN KEY ("userId") REFERENCES "User"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "ApiToken" ADD CONSTRAINT "ApiToken_userId_fkey" FOREIGN KEY ("userId") REFERENCES "User"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Adapter" ADD CONSTRAINT "Adapter_modelId_fkey" FOREIGN KEY ("modelId") REFERENCES "CatalogModel"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Replica" ADD CONSTRAINT "Replica_modelId_fkey" FOREIGN KEY ("modelId") REFERENCES "CatalogModel"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Replica" ADD CONSTRAINT "Replica_nodeId_fkey" FOREIGN KEY ("nodeId") REFERENCES "Node"("id") ON DELETE SET NULL ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "ServeJobStep" ADD CONSTRAINT "ServeJobStep_jobId_fkey" FOREIGN KEY ("jobId") REFERENCES "ServeJob"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "TrainJob" ADD CONSTRAINT "TrainJob_nodeId_fkey" FOREIGN KEY ("nodeId") REFERENCES "Node"("id") ON DELETE SET NULL ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "TrainJob" ADD CONSTRAINT "TrainJob_createdById_fkey" FOREIGN KEY ("createdById") REFERENCES "User"("id") ON DELETE SET NULL ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "TrainMetric" ADD CONSTRAINT "TrainMetric_jobId_fkey" FOREIGN KEY ("jobId") REFERENCES "TrainJob"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "TrainEvent" ADD CONSTRAINT "TrainEvent_jobId_fkey" FOREIGN KEY ("jobId") REFERENCES "TrainJob"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "TrainArtifact" ADD CONSTRAINT "TrainArtifact_jobId_fkey" FOREIGN KEY ("jobId") REFERENCES "TrainJob"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Team" ADD CONSTRAINT "Team_orgId_fkey" FOREIGN KEY ("orgId") REFERENCES "Org"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Project" ADD CONSTRAINT "Project_teamId_fkey" FOREIGN KEY ("teamId") REFERENCES "Team"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Membership" ADD CONSTRAINT "Membership_orgId_fkey" FOREIGN KEY ("orgId") REFERENCES "Org"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Membership" ADD CONSTRAINT "Membership_teamId_fkey" FOREIGN KEY ("teamId") REFERENCES "Team"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Membership" ADD CONSTRAINT "Membership_projectId_fkey" FOREIGN KEY ("projectId") REFERENCES "Project"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Membership" ADD CONSTRAINT "Membership_userId_fkey" FOREIGN KEY ("userId") REFERENCES "User"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Membership" ADD CONSTRAINT "Membership_apiTokenId_fkey" FOREIGN KEY ("apiTokenId") REFERENCES "ApiToken"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "Collection" ADD CONSTRAINT "Collection_orgId_fkey" FOREIGN KEY ("orgId") REFERENCES "Org"("id") ON DELETE CASCADE ON UPDATE CASCADE;
