-- Of each usage row's prompt tokens, those the replica reused from its prompt cache (#29).
ALTER TABLE "UsageMinute" ADD COLUMN     "cachedTokens" BIGINT NOT NULL DEFAULT 0;
