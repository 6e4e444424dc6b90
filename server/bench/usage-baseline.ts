import pg from 'pg';

// The baseline of bench/usage.ts, in a process of its own: the same rows summed by one plain GROUP BY pass (per day
// over 31 days, per minute of one model over one day, per token over 24 hours) with node-postgres and nothing of
// Hangar's, each timed over `rounds` runs. Prints one JSON line: median ms per query.
//   tsx bench/usage-baseline.ts <database url> <from ms> <rounds>

const [url = '', fromArg = '0', roundsArg = '5'] = process.argv.slice(2);
const FROM = Number(fromArg);
const ROUNDS = Number(roundsArg);
const DAY = 86_400_000;
const client = new pg.Client({ connectionString: url });
await client.connect();

const window = (from: number, to: number) =>
  `"minute" >= (to_timestamp(${from / 1000}) AT TIME ZONE 'UTC') AND "minute" < (to_timestamp(${to / 1000}) AT TIME ZONE 'UTC')`;
const sums = `sum(requests)::float8, sum(errors)::float8, sum(aborted)::float8, sum("promptTokens")::float8,
  sum("completionTokens")::float8, sum("ttftMsSum")::float8, sum("ttftCount")::float8`;
const queries: Record<string, string> = {
  month: `SELECT date_trunc('day', minute), ${sums} FROM "UsageMinute" WHERE ${window(FROM, FROM + 31 * DAY)} GROUP BY 1`,
  day: `SELECT minute, ${sums} FROM "UsageMinute" WHERE model = 'model-0' AND ${window(FROM + 30 * DAY, FROM + 31 * DAY)} GROUP BY 1`,
  tokens: `SELECT "tokenId", ${sums} FROM "UsageMinute" WHERE "tokenId" IN (${Array.from({ length: 20 }, (_, i) => `'tok-${i}'`).join(',')}) AND ${window(FROM + 30 * DAY, FROM + 31 * DAY)} GROUP BY 1`,
};

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
const out: Record<string, number> = {};
for (const [name, sql] of Object.entries(queries)) {
  await client.query(sql);
  const times: number[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    const t0 = performance.now();
    await client.query(sql);
    times.push(performance.now() - t0);
  }
  out[name] = median(times);
}
await client.end();
console.log(JSON.stringify(out));
