-- The start of each day up to each of its hours, kept by the rollup trigger (gateway/usage-rollup.ts) from now on,
-- so a step that starts off midnight reads one row per caller for the stretch from midnight (#33).
-- CreateTable
CREATE TABLE "UsageDayPrefix" (
    "id" BIGSERIAL NOT NULL,
    "day" TIMESTAMP(3) NOT NULL,
    "until" TIMESTAMP(3) NOT NULL,
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

    CONSTRAINT "UsageDayPrefix_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE UNIQUE INDEX "UsageDayPrefix_day_until_key" ON "UsageDayPrefix"("day", "until", "tokenId", "userId", "model", "adapter", "replicaId");

-- What UsageHour already holds, added up once: each hour row counts towards every prefix of its day that ends after
-- it. (Hours already pruned have no prefixes, and the queries read none from before the hours kept.)
INSERT INTO "UsageDayPrefix" ("day", "until", "tokenId", "userId", model, adapter, node, "replicaId", requests, errors,
  aborted, "promptTokens", "completionTokens", "cachedTokens", "ttftMsSum", "ttftCount", "durationMsSum", "durationBuckets")
SELECT date_trunc('day', h.hour), u.until, "tokenId", "userId", model, adapter, max(node), "replicaId", sum(requests),
  sum(errors), sum(aborted), sum("promptTokens"), sum("completionTokens"), sum("cachedTokens"), sum("ttftMsSum"),
  sum("ttftCount"), sum("durationMsSum"),
  ARRAY[sum(coalesce("durationBuckets"[1], 0)), sum(coalesce("durationBuckets"[2], 0)), sum(coalesce("durationBuckets"[3], 0)), sum(coalesce("durationBuckets"[4], 0)), sum(coalesce("durationBuckets"[5], 0)), sum(coalesce("durationBuckets"[6], 0)), sum(coalesce("durationBuckets"[7], 0)), sum(coalesce("durationBuckets"[8], 0)), sum(coalesce("durationBuckets"[9], 0)), sum(coalesce("durationBuckets"[10], 0)), sum(coalesce("durationBuckets"[11], 0)), sum(coalesce("durationBuckets"[12], 0))]::bigint[]
FROM "UsageHour" h
  CROSS JOIN LATERAL generate_series(h.hour + interval '1 hour', date_trunc('day', h.hour) + interval '23 hours',
    interval '1 hour') AS u(until)
GROUP BY date_trunc('day', h.hour), u.until, "tokenId", "userId", model, adapter, "replicaId";
