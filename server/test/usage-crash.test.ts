import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { openAiClient, readChatStream } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { type DbRelay, relayedDatabase } from './fixtures/db-relay.js';
import { startReportingNode } from './fixtures/reporting-node.js';
import { kill, operatorToken, type ServerProcess, startServer, until } from './fixtures/server-process.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';

// The night the usage was lost: PostgreSQL goes away while applications keep calling models through the gateway
// (which answers from what it holds in memory), and then the server itself is killed with SIGKILL, so no
// shutdown code runs. The real server as its own process (`node --import tsx src/main.ts`), the official
// `openai` client, a stand-in replica on a real socket, and a real PostgreSQL behind a relay the test cuts
// (every connection reset, new ones refused: as a database restart or failover looks to the server). Once the
// database is back and the server starts again, every request it answered is in the usage, once.

const KEY = 'hgk_usage-crash-engine-key-0123456789abcdef';
/** Requests sent while the database is away. */
const DURING_OUTAGE = 240;

let relay: DbRelay;
let dataDir: string;
let replica: StandInReplica;
const servers: ServerProcess[] = [];

beforeAll(async () => {
  relay = await relayedDatabase();
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-usage-crash-'));
  replica = await startStandInReplica({ key: KEY });
});

afterAll(async () => {
  for (const s of servers) await kill(s, 'SIGKILL');
  await replica?.close();
  await relay?.database.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

async function start(): Promise<ServerProcess> {
  const server = await startServer({
    DATABASE_URL: relay.database.url,
    HANGAR_DATA_DIR: dataDir,
    HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
  });
  servers.push(server);
  return server;
}

/** Requests the spool files under the data dir hold (what this test waits on before it kills the server). */
async function spooledRequests(): Promise<number> {
  const dir = path.join(dataDir, 'usage');
  let n = 0;
  for (const name of await fs.readdir(dir).catch(() => [] as string[])) {
    for (const line of (await fs.readFile(path.join(dir, name), 'utf8')).split('\n')) {
      try {
        for (const row of (JSON.parse(line) as { rows: { requests: number }[] }).rows) n += row.requests;
      } catch {
        // a line being written
      }
    }
  }
  return n;
}

const accounted = async () => {
  const sums = await relay.database.prisma.usageMinute.aggregate({
    where: { model: 'crashy' },
    _sum: { requests: true, promptTokens: true, completionTokens: true },
  });
  return {
    requests: sums._sum.requests ?? 0,
    promptTokens: Number(sums._sum.promptTokens ?? 0n),
    completionTokens: Number(sums._sum.completionTokens ?? 0n),
  };
};

describe('usage through a database outage and a kill -9', () => {
  it('accounts every request answered while PostgreSQL was away, once, after the server is killed', async () => {
    const first = await start();
    const token = await operatorToken(first.base);
    const db = relay.database.prisma;
    // A node that keeps reporting: one that never does is offline, and placement would take its replica as lost.
    const node = await startReportingNode(db, 'gpu-crash');
    onTestFinished(node.stop);
    const model = await db.catalogModel.create({
      data: { name: 'crashy', source: 'http://mirror.example/mirror/crashy/v1/model.gguf', engine: 'vllm' },
    });
    const r = await db.replica.create({
      data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
    });
    await db.engineKey.create({ data: { replicaId: r.id, key: KEY } });

    const client = openAiClient(first.base, token, { timeoutMs: 20_000 });
    const ask = async () => {
      const stream = await client.chat.completions.create({
        model: 'crashy',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      });
      return (await readChatStream(stream)).text;
    };
    // Routable within the route table's next refresh; the caller is known to the gateway from then on.
    await until(
      'the model answers',
      async () => ((await ask().catch(() => '')) === replica.words.join('') ? true : undefined),
      20_000,
    );
    let answered = 1;

    await relay.cut();
    let failed = 0;
    for (let i = 0; i < DURING_OUTAGE; i += 8) {
      const batch = await Promise.allSettled(Array.from({ length: 8 }, ask));
      for (const b of batch) {
        if (b.status === 'fulfilled' && b.value === replica.words.join('')) answered++;
        else failed++;
      }
    }
    // The gateway serves through the outage (what the spool is for is what it answered).
    expect(failed).toBe(0);
    // A crash loses at most the second not yet on disk: the kill comes once the spool holds every answer (or,
    // without a spool, 5 s later, which is what the usage had then).
    const spooled = async () => ((await spooledRequests()) >= answered ? true : undefined);
    await until('the spool holds every answer', spooled, 5000).catch(() => {});
    await kill(first, 'SIGKILL');
    expect(first.proc.signalCode).toBe('SIGKILL');

    await relay.mend();
    const second = await start();
    const deadline = Date.now() + 30_000;
    while ((await accounted()).requests < answered && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 200));
    }
    const after = await accounted();
    console.info(`usage crash test: ${answered} requests answered, ${after.requests} accounted after the kill -9`);
    // The stand-in's usage chunk: 4 prompt tokens and its 3 words, for each.
    expect(after).toEqual({ requests: answered, promptTokens: 4 * answered, completionTokens: 3 * answered });
    // The dead process's spool was added and removed; nothing is added twice when the server starts again.
    await until(
      'the replayed spool is removed',
      async () => ((await spooledRequests()) === 0 ? true : undefined),
      10_000,
    );
    await kill(second, 'SIGTERM');
    expect(await fs.readdir(path.join(dataDir, 'usage'))).toEqual([]);
    expect(await db.$queryRaw`SELECT generation FROM "UsageSpool"`).toEqual([]);
    await kill(await start(), 'SIGTERM');
    expect((await accounted()).requests).toBe(answered);
  }, 120_000);
});
