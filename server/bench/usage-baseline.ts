import pg from 'pg';

// The baseline of bench/usage.ts, in a process of its own: the same answers summed by one plain GROUP BY pass over
// the minute rows (UsageMinute), histogram included, with node-postgres and nothing of Hangar's: what Hangar's usage()
// sent before the rollups (#33). Each query is timed over `rounds` runs. Prints one JSON line: median ms per query.
//   tsx bench/usage-baseline.ts <database url> <queries as JSON: {name: sql}> <rounds>

const [url = '', queriesArg = '{}', roundsArg = '5'] = process.argv.slice(2);
const queries = JSON.parse(queriesArg) as Record<string, string>;
const ROUNDS = Number(roundsArg);
const client = new pg.Client({ connectionString: url });
await client.connect();

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
const out: Record<string, { median: number; min: number; max: number }> = {};
for (const [name, sql] of Object.entries(queries)) {
  await client.query(sql);
  const times: number[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    const t0 = performance.now();
    await client.query(sql);
    times.push(performance.now() - t0);
  }
  out[name] = { median: median(times), min: Math.min(...times), max: Math.max(...times) };
}
await client.end();
console.log(JSON.stringify(out));
