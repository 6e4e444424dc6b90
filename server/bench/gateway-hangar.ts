import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import inspector from 'node:inspector/promises';
import os from 'node:os';
import path from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';
import { createLogger } from '@hangar/common/log';
import { createApp } from '../src/app.js';
import { systemActor } from '../src/auth/actor.js';
import { hashSecret } from '../src/auth/secrets.js';
import { loadConfig } from '../src/config.js';
import { benchToken } from './api-token.js';

// The Hangar of bench/gateway.ts, in a process of its own as deployed (its CPU and memory are its own, and the
// client, the engine and the baselines are not billed to it): createApp on an embedded PostgreSQL, a caller token,
// and the fleet as an agent would have reported it, a node kept online and a catalog model whose READY replica is
// the stand-in engine (HANGAR_BENCH_ENGINE, HANGAR_BENCH_ENGINE_KEY). A second caller has three limits that apply
// to every request and never refuse one (#28). Sends {url, token, limitedToken, databaseUrl, dataDir} when ready,
// then answers:
//   {count: 'usage'}: memory after a full GC and CPU time so far; {count: 'inFlight'}: requests in flight;
//   {models: n}: adds n more models, each with a READY replica on the engine and an adapter (the 1,000-model run);
//   {profile: 'start'} / {profile: 'stop', file}: V8's CPU profile of what ran in between, written to `file`.

const engine = process.env.HANGAR_BENCH_ENGINE ?? '';
const engineKey = process.env.HANGAR_BENCH_ENGINE_KEY ?? '';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const root = path.join(os.tmpdir(), `hangar-bench-gateway-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
  // The 1000 open streams, and the client's keep-alive sockets besides, all from one address (loopback) and one
  // caller: the shares that keep one client from starving the rest would cut them at 512.
  HANGAR_MAX_CONNECTIONS: '4096',
  HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '4096',
  HANGAR_MAX_CONNECTIONS_PER_CALLER: '4096',
  // =1 reads the whole catalog every second, as the route table did before it followed events: the baseline of
  // the 1,000-model line.
  HANGAR_GATEWAY_ROUTES_REREAD_SECONDS: process.env.HANGAR_GATEWAY_ROUTES_REREAD_SECONDS ?? '60',
  // =1 runs the placement pass at every look (5 s), as it did before it followed events: bench/placement-idle.ts's
  // baseline.
  HANGAR_PLACEMENT_REREAD_SECONDS: process.env.HANGAR_PLACEMENT_REREAD_SECONDS ?? '60',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
const url = await app.start();
const db = app.db.prisma;
const token = await benchToken(url, { callerOnly: true });

const node = await db.node.create({
  data: {
    name: 'bench-node',
    tokenHash: hashSecret(randomBytes(16).toString('hex')),
    lastSeenAt: new Date(),
    engines: [{ name: 'llama.cpp', version: 'bench', build: 9999 }],
  },
});
// Placement counts a node silent for 30 s as gone, and its replicas lost: every bench node reports, in one statement.
const heartbeat = setInterval(
  () =>
    void db.node
      .updateMany({ where: { name: { startsWith: 'bench-node' } }, data: { lastSeenAt: new Date() } })
      .catch(() => {}),
  5000,
);
/**
 * The 1,000-model run's replicas go REPLICAS_PER_NODE to a node, as a fleet would hold them: a thousand on one node
 * made every insert recount the GPU-time shares of all the others there (fleet/gpu-time.ts), and the setup alone
 * took over 15 minutes.
 */
const REPLICAS_PER_NODE = 25;
const served = async (name: string, adapter?: string) => {
  const model = await db.catalogModel.create({
    data: { name, source: `bench/${name}`, engine: 'llamacpp', minReplicas: 1, maxReplicas: 1 },
  });
  const replica = await db.replica.create({
    data: {
      modelId: model.id,
      nodeId: node.id,
      state: 'READY',
      endpoint: engine,
      adapters: adapter ? [adapter] : [],
      engineKey: { create: { key: engineKey } },
    },
  });
  if (adapter) {
    await db.adapter.create({
      data: { name: adapter, source: `bench/${adapter}`, modelId: model.id, artifactSha256: 'bench' },
    });
  }
  return replica;
};
const replica = await served('bench');
await app.services.gateway.routes.refresh();

const limitedToken = await benchToken(url, { callerOnly: true });
const limitedId = (await db.apiToken.findFirst({ orderBy: { createdAt: 'desc' }, select: { id: true } }))?.id as string;
const org = await db.org.create({ data: { name: 'bench-org' } });
await db.membership.create({ data: { orgId: org.id, apiTokenId: limitedId } });
for (const [scope, model, limit] of [
  [`key:${limitedId}`, null, { requestsPerMinute: 1_000_000_000 }],
  [`key:${limitedId}`, 'bench', { tokensPerMinute: 1_000_000_000 }],
  ['org:bench-org', null, { tokensPerDay: 1_000_000_000_000 }],
] as const) {
  const set = await app.services.limits.setLimit(systemActor('bench'), { scope, model, limit });
  if (!set.ok) throw new Error(`bench: setLimit ${scope}: ${set.error.message}`);
}

let models = 1;
let session: inspector.Session | undefined;

process.on('message', async (m: { count?: string; models?: number; profile?: 'start' | 'stop'; file?: string }) => {
  try {
    if (m.count === 'usage') {
      gc();
      const { rss, heapUsed } = process.memoryUsage();
      const cpu = process.cpuUsage();
      return process.send?.({ ok: { rss, heap: heapUsed, cpuMs: (cpu.user + cpu.system) / 1000 } });
    }
    if (m.count === 'inFlight') return process.send?.({ ok: app.services.gateway.load(replica.id).inFlight });
    if (m.models) {
      // In one transaction of a few statements: one by one, a thousand models took minutes on a loaded machine.
      const names = Array.from({ length: m.models }, (_, i) => `bench-${models + i}`);
      models += m.models;
      await db.$transaction(
        async (tx) => {
          const nodes = await tx.node.createManyAndReturn({
            data: Array.from({ length: Math.ceil(names.length / REPLICAS_PER_NODE) }, (_, i) => ({
              name: `bench-node-${models}-${i}`,
              tokenHash: hashSecret(randomBytes(16).toString('hex')),
              lastSeenAt: new Date(),
              engines: [{ name: 'llama.cpp', version: 'bench', build: 9999 }],
            })),
            select: { id: true },
          });
          const made = await tx.catalogModel.createManyAndReturn({
            data: names.map((name) => ({
              name,
              source: `bench/${name}`,
              engine: 'llamacpp',
              minReplicas: 1,
              maxReplicas: 1,
            })),
            select: { id: true, name: true },
          });
          const replicas = await tx.replica.createManyAndReturn({
            data: made.map((model, i) => ({
              modelId: model.id,
              nodeId: (nodes[Math.floor(i / REPLICAS_PER_NODE)] as { id: string }).id,
              state: 'READY' as const,
              endpoint: engine,
              adapters: [`${model.name}-lora`],
            })),
            select: { id: true },
          });
          await tx.engineKey.createMany({ data: replicas.map((r) => ({ replicaId: r.id, key: engineKey })) });
          await tx.adapter.createMany({
            data: made.map((model) => ({
              name: `${model.name}-lora`,
              source: `bench/${model.name}-lora`,
              modelId: model.id,
              artifactSha256: 'bench',
            })),
          });
          // A loaded machine (the bench shares it) takes seconds over this.
        },
        { timeout: 300_000, maxWait: 60_000 },
      );
      await app.services.gateway.routes.refresh();
      return process.send?.({ ok: app.services.gateway.routes.models().length });
    }
    if (m.profile === 'start') {
      session = new inspector.Session();
      session.connect();
      await session.post('Profiler.enable');
      await session.post('Profiler.setSamplingInterval', { interval: 100 });
      await session.post('Profiler.start');
      return process.send?.({ ok: true });
    }
    if (m.profile === 'stop' && session && m.file) {
      const { profile } = await session.post('Profiler.stop');
      await fs.writeFile(m.file, JSON.stringify(profile));
      session.disconnect();
      session = undefined;
      return process.send?.({ ok: true });
    }
    process.send?.({ error: `gateway-hangar: no such question ${JSON.stringify(m)}` });
  } catch (err) {
    process.send?.({ error: (err as Error).stack ?? String(err) });
  }
});
process.on('disconnect', async () => {
  clearInterval(heartbeat);
  await app.stop().catch(() => {});
  await fs.rm(root, { recursive: true, force: true });
  process.exit(0);
});
// The database and the data dir, for the same Hangar run with HANGAR_WORKERS beside it (bench/gateway.ts).
process.send?.({ url, token, limitedToken, databaseUrl: app.db.url, dataDir: root });
