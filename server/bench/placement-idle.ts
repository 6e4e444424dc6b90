import { fork, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

// What an idle server costs as its catalog grows (#33: flat from 1 to 1,000 models). Two Hangars, each in a process
// of its own (bench/gateway-hangar.ts: createApp on its own embedded PostgreSQL, a node kept reporting, a model
// with a READY replica), side by side and idle, their CPU read from /proc over the same windows:
//   - the baseline runs the placement pass at every look, 5 s apart, as it did before the pass followed the
//     catalog's events (HANGAR_PLACEMENT_REREAD_SECONDS=1); with HANGAR_BENCH_BASELINE_DIR=<a checkout's server/>
//     it is that checkout's gateway-hangar.ts instead (the code before a change, exactly);
//   - Hangar runs as deployed.
// Both are measured at 1 model, then again after 999 more models, each with an adapter and a READY replica, 25 to a
// node. Printed: each side's idle CPU in ms per second (median of the windows, lowest–highest), 1,000 models against
// 1, and Hangar against the baseline at 1,000. CPU time is what load distorts least; the load average is printed.
//
// `tsx bench/placement-idle.ts [windows] [seconds per window]` (defaults 6 × 10 s).

const WINDOWS = Number(process.argv[2] ?? 6);
const WINDOW_MS = Number(process.argv[3] ?? 10) * 1000;
const MANY_MODELS = 1000;
/** After the 999 models land: their events, the passes and route-table reads they set off, settle first. */
const SETTLE_MS = 15_000;
const TICK_MS = 1000 / Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim() || 100);

const here = path.dirname(new URL(import.meta.url).pathname);
const baselineDir = process.env.HANGAR_BENCH_BASELINE_DIR;

function start(file: string, env: Record<string, string>) {
  const child = fork(file, [], {
    cwd: path.dirname(path.dirname(file)),
    execArgv: ['--import', 'tsx'],
    env: {
      ...process.env,
      // Nothing is proxied here: the replicas' endpoint is never called.
      HANGAR_BENCH_ENGINE: 'http://127.0.0.1:9/v1',
      HANGAR_BENCH_ENGINE_KEY: 'hgk_placement-idle-bench-key-0123456789abcdef',
      ...env,
    },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const first = new Promise<unknown>((resolve, reject) => {
    child.once('message', resolve);
    child.once('exit', (code) => reject(new Error(`${file} exited (${code}) before it was ready`)));
  });
  return { child, first };
}

function ask<T>(child: ReturnType<typeof start>['child'], message: unknown): Promise<T> {
  return new Promise((resolve, reject) => {
    child.once('message', (m: { ok?: T; error?: string }) => {
      if (m.error) reject(new Error(m.error));
      else resolve((m.ok ?? m) as T);
    });
    child.send(message as object);
  });
}

/** A process's CPU time so far (user + system), in ms, from /proc. */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) * TICK_MS;
}

// One after the other: two embedded PostgreSQLs starting at once could pick the same free port.
const baseline = start(
  path.join(baselineDir ?? path.dirname(here), 'bench', 'gateway-hangar.ts'),
  baselineDir ? {} : { HANGAR_PLACEMENT_REREAD_SECONDS: '1' },
);
await baseline.first;
const hangar = start(path.join(here, 'gateway-hangar.ts'), {});
const sides = [
  { name: baselineDir ? `baseline (${baselineDir})` : 'baseline (a pass every look)', ...baseline },
  { name: 'Hangar', ...hangar },
];
const load = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');

/** Idle CPU of every side over the same windows, in ms per second. */
async function idle(): Promise<number[][]> {
  const out = sides.map(() => [] as number[]);
  for (let w = 0; w < WINDOWS; w++) {
    const from = sides.map((s) => cpuMs(s.child.pid as number));
    const started = performance.now();
    await new Promise((r) => setTimeout(r, WINDOW_MS));
    const ms = performance.now() - started;
    for (const [i, s] of sides.entries()) out[i]?.push(((cpuMs(s.child.pid as number) - (from[i] ?? 0)) * 1000) / ms);
  }
  return out;
}

const at = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.floor(q * (xs.length - 1))] ?? 0;
const median = (xs: number[]) => at(xs, 0.5);
const spread = (xs: number[]) =>
  `${median(xs).toFixed(1)} (${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}) ms/s`;

try {
  await Promise.all(sides.map((s) => s.first));
  console.log(
    `placement idle: ${WINDOWS} windows of ${WINDOW_MS / 1000} s, ${os.cpus().length} cores, load average ${load()} at the start`,
  );
  // Past the start's own work (migrations, the first passes, JIT).
  await new Promise((r) => setTimeout(r, SETTLE_MS));
  const one = await idle();
  const totals = await Promise.all(sides.map((s) => ask<number>(s.child, { models: MANY_MODELS - 1 })));
  await new Promise((r) => setTimeout(r, SETTLE_MS));
  const many = await idle();
  sides.forEach((s, i) => {
    const a = one[i] ?? [];
    const b = many[i] ?? [];
    console.log(
      `  ${s.name}: 1 model ${spread(a)}; ${totals[i]} models + adapters ${spread(b)}; ${(median(b) / median(a)).toFixed(2)}× the 1-model idle`,
    );
  });
  const ratio = median(many[1] ?? []) / median(many[0] ?? []);
  console.log(`  at ${MANY_MODELS} models Hangar idles at ${ratio.toFixed(2)}× the baseline's CPU`);
  console.log(`  load average at the end: ${load()}`);
} finally {
  // Each Hangar stops on its own when its channel closes (its PostgreSQL with it).
  await Promise.all(
    sides.map(async (s) => {
      const stopped = new Promise((r) => s.child.once('exit', r));
      if (s.child.connected) s.child.disconnect();
      await Promise.race([stopped, new Promise((r) => setTimeout(r, 20_000))]);
    }),
  );
}
