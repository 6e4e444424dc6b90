// What is left of a scope's limits, on one muted line: "Limits: 248,800 of 250,000 tokens today left · 12.50 of
// 12.50 to spend this month left". The Limits page has every scope's in full; a token's row and a team on the
// Organisations page show their own with this.

const LIMIT_WORDS: Record<string, string> = {
  requestsPerMinute: 'requests this minute',
  tokensPerMinute: 'tokens this minute',
  concurrentRequests: 'at once',
  tokensPerDay: 'tokens today',
  tokensPerMonth: 'tokens this month',
  spendPerMonth: 'to spend this month',
};

export type LimitLeft = {
  model: string | null;
  usage: readonly { kind: string; limit: number; remaining: number }[];
};

const amount = (kind: string, n: number) => (kind === 'spendPerMonth' ? n.toFixed(2) : n.toLocaleString('en'));

export function LimitsLeft({ limits, testId }: { limits: readonly LimitLeft[]; testId: string }) {
  if (!limits.length) return null;
  const parts = limits.flatMap((l) =>
    l.usage.map(
      (u) =>
        `${amount(u.kind, u.remaining)} of ${amount(u.kind, u.limit)} ${LIMIT_WORDS[u.kind] ?? u.kind} left${l.model ? ` (${l.model})` : ''}`,
    ),
  );
  return (
    <div className="hint token-limits" data-testid={testId}>
      Limits: {parts.join(' · ')}
    </div>
  );
}
