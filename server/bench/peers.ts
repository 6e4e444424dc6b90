import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { LlamaRuntime } from '@hangar/agent/llama-runtime';
import { createLogger } from '@hangar/common/log';
import { sleep } from '@hangar/common/retry';
import { sha256 } from '@hangar/common/test/fixtures/fault-upstream';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { benchToken } from './api-token.js';
import { originLink } from './origin-link.js';

// Weights node to node (#31): eight agents on loopback, each with its link capped in the agent
// (HANGAR_AGENT_TRANSFER_RATE: downloads share one rate, files served to other nodes another), start one model at
// once. Without peers (HANGAR_AGENT_PEERS=off, Hangar before #31) every node pulls every byte from the mirror;
// with peers the mirror serves about one copy and the nodes the rest to one another. Reported per way: the bytes
// the mirror sent (its /metrics counter) and the time from the serve to all eight replicas READY; the ratios are
// without / with. The two ways alternate round by round against one real Hangar (createApp, PostgreSQL), each
// round with new nodes and empty caches. The control plane's own uplink is capped too (origin-link.ts, a TCP proxy
// the agents reach it through; by default at a node's rate, as one more machine on the same network): uncapped, as
// loopback is, it would send eight copies as fast as eight capped nodes take them, which a real uplink would not.
// The model is the test fixture's random-weight llama, scaled (`SHAPE`, about 35 MB) in place of the issue's 1 GiB
// so that a round takes seconds on two cores; at RATE a copy takes SIZE/RATE either way.
//
// `tsx bench/peers.ts [rounds] [MiB/s per node] [MiB/s of the control plane's uplink, 0: uncapped]` (default 2
// rounds, 4 MiB/s and the same: the caps, not two busy cores, are then what a copy's time is made of).

const ROUNDS = Number(process.argv[2] ?? 2);
const RATE = Number(process.argv[3] ?? 4) * 2 ** 20;
/** The control plane's uplink (origin-link.ts); 0: none, loopback as fast as it goes. Default: a node's rate. */
const ORIGIN = Number(process.argv[4] ?? process.argv[3] ?? 4) * 2 ** 20;
const NODES = 8;
const SHAPE = { embd: 128, layers: 2, heads: 4, kvHeads: 4, ff: 256 };

const root = path.join(os.tmpdir(), `hangar-bench-peers-${process.pid}`);
await fs.mkdir(root, { recursive: true });
const link = ORIGIN > 0 ? await originLink(ORIGIN) : null;
const config = loadConfig({
  HANGAR_DATA_DIR: path.join(root, 'hangar'),
  // The agents reach Hangar, and the mirror URLs it hands them lead, through the link.
  ...(link ? { HANGAR_PUBLIC_URL: link.url } : {}),
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
const base = await app.start();
link?.to(base);
const agentUrl = link?.url ?? base;
const admin = await benchToken(base, { role: 'ADMIN' });
const runtime = LlamaRuntime.create({ threads: 1, gpu: false });

const gql = async (query: string) => {
  const res = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${admin}` },
    body: JSON.stringify({ query }),
  });
  const body = (await res.json()) as { data?: Record<string, { token?: string }>; errors?: { message: string }[] };
  if (body.errors) throw new Error(body.errors.map((e) => e.message).join('; '));
  return body.data ?? {};
};

const model = tinyLlama({ shape: SHAPE });
const put = await fetch(`${base}/mirror/bench-llama/v1/model.gguf`, {
  method: 'PUT',
  headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(model) },
  body: new Uint8Array(model),
});
if (put.status !== 201) throw new Error(`the mirror refused the model: ${put.status} ${await put.text()}`);

const mirrorSent = async () => {
  const metric = app.metrics.registry.getSingleMetric('hangar_mirror_sent_bytes_total');
  return (await metric?.get())?.values[0]?.value ?? 0;
};

/** To all READY; to every node holding the file (the transfer alone, before loading and smoke tests). */
type Result = { seconds: number; cachedSeconds: number; mirrorBytes: number };

async function round(way: 'without' | 'with', n: number): Promise<Result> {
  const agents: Agent[] = [];
  for (let i = 0; i < NODES; i++) {
    const name = `bench-${way}-${n}-${i}`;
    const made = await gql(`mutation { createNode(name: "${name}") { ... on CreatedNode { token } } }`);
    const agent = createAgent(
      loadAgentConfig({
        HANGAR_URL: agentUrl,
        HANGAR_NODE_TOKEN: String(made.createNode?.token),
        HANGAR_AGENT_DIR: path.join(root, name),
        HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
        HANGAR_AGENT_THREADS: '1',
        HANGAR_AGENT_HEARTBEAT_MS: '1000',
        HANGAR_AGENT_POLL_MS: '500',
        HANGAR_AGENT_TRANSFER_RATE: String(RATE),
        HANGAR_AGENT_PEERS: way === 'with' ? 'on' : 'off',
        HANGAR_LOG_LEVEL: 'warn',
      }),
      { log: createLogger('warn'), runtime: () => runtime },
    );
    agents.push(agent);
    await agent.start();
  }
  const name = `bench-${way}-${n}`;
  const sentBefore = await mirrorSent();
  const started = performance.now();
  await gql(
    `mutation { serveMirrorVersion(model: "bench-llama", version: "v1", name: "${name}", mode: ALWAYS, replicas: ${NODES}) { __typename ... on Error { message } } }`,
  );
  await app.services.fleet.place();
  const cachedFiles = Array.from({ length: NODES }, (_, i) =>
    path.join(root, `bench-${way}-${n}-${i}`, 'models', `${sha256(model)}.gguf`),
  );
  let cachedSeconds = 0;
  for (;;) {
    if (!cachedSeconds) {
      const held = await Promise.all(
        cachedFiles.map((f) =>
          fs.stat(f).then(
            () => true,
            () => false,
          ),
        ),
      );
      if (held.every(Boolean)) cachedSeconds = (performance.now() - started) / 1000;
    }
    const rows = await app.db.prisma.replica.findMany({ where: { model: { name } } });
    const failed = rows.find((r) => r.state === 'FAILED');
    if (failed) throw new Error(`${name}: a replica failed: ${failed.message}`);
    if (rows.filter((r) => r.state === 'READY').length === NODES) break;
    await sleep(100);
  }
  const seconds = (performance.now() - started) / 1000;
  const mirrorBytes = (await mirrorSent()) - sentBefore;
  await gql(`mutation { setModelMode(name: "${name}", mode: STOPPED) { __typename } }`);
  await Promise.all(agents.map((a) => a.stop()));
  return { seconds, cachedSeconds: cachedSeconds || seconds, mirrorBytes };
}

const results: Record<'without' | 'with', Result[]> = { without: [], with: [] };
for (let n = 0; n < ROUNDS; n++) {
  // The order alternates, so neither way always runs on a warmer machine.
  for (const way of n % 2 ? (['with', 'without'] as const) : (['without', 'with'] as const)) {
    const r = await round(way, n);
    results[way].push(r);
    console.log(
      `round ${n + 1} ${way} peers: ${r.cachedSeconds.toFixed(1)} s to ${NODES} copies, ${r.seconds.toFixed(1)} s to ${NODES} READY, mirror sent ${mb(r.mirrorBytes)}`,
    );
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const spread = (xs: number[]) => `${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}`;
const w = results.with;
const wo = results.without;
console.log(
  `\n${NODES} nodes, a ${mb(model.length)} model, each node capped at ${mb(RATE)}/s, the control plane at ${ORIGIN ? `${mb(ORIGIN)}/s` : 'no cap'}, ${ROUNDS} rounds (median, spread):`,
);
for (const [label, rs] of [
  ['without peers', wo],
  ['with peers   ', w],
] as const)
  console.log(
    `  ${label}: copies ${median(rs.map((r) => r.cachedSeconds)).toFixed(1)} s (${spread(rs.map((r) => r.cachedSeconds))}), READY ${median(rs.map((r) => r.seconds)).toFixed(1)} s (${spread(rs.map((r) => r.seconds))}), mirror sent ${mb(median(rs.map((r) => r.mirrorBytes)))}`,
  );
const ratio = (f: (r: Result) => number) => (median(wo.map(f)) / median(w.map(f))).toFixed(2);
console.log(
  `  without / with: mirror bytes ${ratio((r) => r.mirrorBytes)}×, time to copies ${ratio((r) => r.cachedSeconds)}×, time to READY ${ratio((r) => r.seconds)}×`,
);

await app.stop();
await link?.close();
await (await runtime).dispose();
await fs.rm(root, { recursive: true, force: true });
process.exit(0);

function mb(n: number) {
  return `${(n / 1e6).toFixed(1)} MB`;
}
