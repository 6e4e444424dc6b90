-- Usage per hour and per day, kept by a trigger on UsageMinute (gateway/usage-rollup.ts) from now on (#33).
-- CreateTable
CREATE TABLE "UsageHour" (
    "id" BIGSERIAL NOT NULL,
    "hour" TIMESTAMP(3) NOT NULL,
    "tokenId" TEXT NOT NULL DEFAULT '',
    "userId" TEXT NOT NULL DEFAULT '',
    "model" TEXT NOT NULL,
    "adapter" TEXT NOT NULL DEFAULT '',
    "node" TEXT NOT NULL DEFAULT '',
    "replicaId" TEXT NOT NULL DEFAULT '',
    "requests" BIGINT NOT NULL DEFAULT 0,
    "errors" BIGINT NOT NULL DEFAULT 0,
    "aborted" BIGINT NOT NULL DEFAULT 0,
    "promptTokens" BIGINT NOT NULL DEFAULT 0,
    "completionTokens" BIGINT NOT NULL DEFAULT 0,
    "cachedTokens" BIGINT NOT NULL DEFAULT 0,
    "ttftMsSum" DOUBLE PRECISION NOT NULL DEFAULT 0,
    "ttftCount" BIGINT NOT NULL DEFAULT 0,
    "durationMsSum" DOUBLE PRECISION NOT NULL DEFAULT 0,
    "durationBuckets" BIGINT[] DEFAULT ARRAY[]::BIGINT[],

    CONSTRAINT "UsageHour_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "UsageDay" (
    "id" BIGSERIAL NOT NULL,
    "day" TIMESTAMP(3) NOT NULL,
    "tokenId" TEXT NOT NULL DEFAULT '',
    "userId" TEXT NOT NULL DEFAULT '',
    "model" TEXT NOT NULL,
    "adapter" TEXT NOT NULL DEFAULT '',
    "node" TEXT NOT NULL DEFAULT '',
    "replicaId" TEXT NOT NULL DEFAULT '',
    "requests" BIGINT NOT NULL DEFAULT 0,
    "errors" BIGINT NOT NULL DEFAULT 0,
    "aborted" BIGINT NOT NULL DEFAULT 0,
    "promptTokens" BIGINT NOT NULL DEFAULT 0,
    "completionTokens" BIGINT NOT NULL DEFAULT 0,
    "cachedTokens" BIGINT NOT NULL DEFAULT 0,
    "ttftMsSum" DOUBLE PRECISION NOT NULL DEFAULT 0,
    "ttftCount" BIGINT NOT NULL DEFAULT 0,
    "durationMsSum" DOUBLE PRECISION NOT NULL DEFAULT 0,
    "durationBuckets" BIGINT[] DEFAULT ARRAY[]::BIGINT[],

    CONSTRAINT "UsageDay_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "UsageHour_model_hour_idx" ON "UsageHour"("model", "hour");

-- CreateIndex
CREATE INDEX "UsageHour_tokenId_hour_idx" ON "UsageHour"("tokenId", "hour");

-- CreateIndex
CREATE UNIQUE INDEX "UsageHour_hour_tokenId_userId_model_adapter_replicaId_key" ON "UsageHour"("hour", "tokenId", "userId", "model", "adapter", "replicaId");

-- CreateIndex
CREATE INDEX "UsageDay_model_day_idx" ON "UsageDay"("model", "day");

-- CreateIndex
CREATE INDEX "UsageDay_tokenId_day_idx" ON "UsageDay"("tokenId", "day");

-- CreateIndex
CREATE UNIQUE INDEX "UsageDay_day_tokenId_userId_model_adapter_replicaId_key" ON "UsageDay"("day", "tokenId", "userId", "model", "adapter", "replicaId");


-- What UsageMinute already holds, added up once: the trigger installed at start adds every later write.
INSERT INTO "UsageHour" ("hour", "tokenId", "userId", model, adapter, node, "replicaId", requests, errors, aborted,
  "promptTokens", "completionTokens", "cachedTokens", "ttftMsSum", "ttftCount", "durationMsSum", "durationBuckets")
SELECT date_trunc('hour', minute), "tokenId", "userId", model, adapter, max(node), "replicaId", sum(requests),
  sum(errors), sum(aborted), sum("promptTokens"), sum("completionTokens"), sum("cachedTokens"), sum("ttftMsSum"),
  sum("ttftCount"), sum("durationMsSum"),
  ARRAY[sum(coalesce("durationBuckets"[1], 0)), sum(coalesce("durationBuckets"[2], 0)), sum(coalesce("durationBuckets"[3], 0)), sum(coalesce("durationBuckets"[4], 0)), sum(coalesce("durationBuckets"[5], 0)), sum(coalesce("durationBuckets"[6], 0)), sum(coalesce("durationBuckets"[7], 0)), sum(coalesce("durationBuckets"[8], 0)), sum(coalesce("durationBuckets"[9], 0)), sum(coalesce("durationBuckets"[10], 0)), sum(coalesce("durationBuckets"[11], 0)), sum(coalesce("durationBuckets"[12], 0))]::bigint[]
FROM "UsageMinute"
GROUP BY date_trunc('hour', minute), "tokenId", "userId", model, adapter, "replicaId";

-- What UsageMinute already holds, added up once: the trigger installed at start adds every later write.
INSERT INTO "UsageDay" ("day", "tokenId", "userId", model, adapter, node, "replicaId", requests, errors, aborted,
  "promptTokens", "completionTokens", "cachedTokens", "ttftMsSum", "ttftCount", "durationMsSum", "durationBuckets")
SELECT date_trunc('day', minute), "tokenId", "userId", model, adapter, max(node), "replicaId", sum(requests),
  sum(errors), sum(aborted), sum("promptTokens"), sum("completionTokens"), sum("cachedTokens"), sum("ttftMsSum"),
  sum("ttftCount"), sum("durationMsSum"),
  ARRAY[sum(coalesce("durationBuckets"[1], 0)), sum(coalesce("durationBuckets"[2], 0)), sum(coalesce("durationBuckets"[3], 0)), sum(coalesce("durationBuckets"[4], 0)), sum(coalesce("durationBuckets"[5], 0)), sum(coalesce("durationBuckets"[6], 0)), sum(coalesce("durationBuckets"[7], 0)), sum(coalesce("durationBuckets"[8], 0)), sum(coalesce("durationBuckets"[9], 0)), sum(coalesce("durationBuckets"[10], 0)), sum(coalesce("durationBuckets"[11], 0)), sum(coalesce("durationBuckets"[12], 0))]::bigint[]
FROM "UsageMinute"
GROUP BY date_trunc('day', minute), "tokenId", "userId", model, adapter, "replicaId";
