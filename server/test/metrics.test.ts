import fs from 'node:fs/promises';
import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findKnownOperations, knownOperationsFile, printKnownOperations } from '../scripts/known-operations.js';
import { failureClass } from '../src/metrics/metrics.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// GET /metrics as Prometheus scrapes it: who may, and whether the figures are the database's and the gateway's
// own. The text is read by the exposition format's grammar (below), every line of it: a line that is not a
// comment or a well-formed sample fails the test.

const KEY = 'hgk_metrics-test-engine-key-0123456789abcdef';

let t: TestApp;
let base: string;
let viewer: string;
let replica: StandInReplica;

async function scrape(
  headers: Record<string, string> = { authorization: `Bearer ${viewer}` },
  url = `${base}/metrics`,
) {
  const res = await fetch(url, { headers });
  return { status: res.status, type: res.headers.get('content-type'), text: await res.text() };
}

type Sample = { name: string; labels: Record<string, string>; value: number };
type Scrape = { types: Map<string, string>; samples: Sample[] };

/** Prometheus' text format 0.0.4: `# HELP`/`# TYPE` lines, and `name{label="value",…} number` samples. */
function parse(text: string): Scrape {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line) continue;
    const type = line.match(/^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/);
    if (type) types.set(type[1]!, type[2]!);
    if (line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[k!] = v!;
    // Values as Prometheus reads them (Go's ParseFloat): NaN and ±Inf in any case (prom-client writes "Nan").
    const raw = m[3]!;
    const special = raw.match(/^([+-]?)(inf|nan)$/i);
    const value = special
      ? special[2]!.toLowerCase() === 'nan'
        ? Number.NaN
        : special[1] === '-'
          ? -Infinity
          : Infinity
      : Number(raw);
    if (!special && (raw.trim() === '' || Number.isNaN(value))) throw new Error(`not a number: ${line}`);
    samples.push({ name: m[1]!, labels, value });
  }
  return { types, samples };
}

/** The value of the sample with this name whose labels include these. */
function value(s: Scrape, name: string, labels: Record<string, string> = {}) {
  return s.samples.find((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v))?.value;
}

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  viewer = await t.token('VIEWER', 'prometheus');
  replica = await startStandInReplica({ key: KEY });
  const db = t.app.db.prisma;
  const file = (name: string, state: 'PRESENT' | 'FAILED' | 'QUEUED' | 'FETCHING', extra = {}) =>
    db.mirrorFile.create({
      data: { model: 'm', version: 'v1', file: name, sourceUrl: `http://hub.example/${name}`, state, ...extra },
    });
  await file('a.gguf', 'PRESENT', { bytesTotal: 1000n, bytesDone: 1000n });
  await file('b.gguf', 'PRESENT', { bytesTotal: 24n, bytesDone: 24n });
  await file('c.gguf', 'FAILED', { error: 'the upstream answered 404 Not Found' });
  await file('d.gguf', 'FAILED', { error: 'sha256 does not match: expected 00…, got ff…' });
  // On storage this server cannot see: it stays QUEUED instead of being leased and tried.
  await file('e.gguf', 'QUEUED', { storageId: 'another-storage' });
  await file('f.gguf', 'FETCHING', {
    bytesDone: 500n,
    bytesPerSecond: 2048,
    leaseOwner: 'x',
    leaseUntil: new Date(Date.now() + 60_000),
  });
  const node = await db.node.create({
    data: {
      name: 'gpu-1',
      tokenHash: 'not-a-real-hash',
      lastSeenAt: new Date(),
      gpus: [{ index: 0, name: 'L4', totalMiB: 24_576, freeMiB: 20_000 }],
    },
  });
  await db.node.create({
    data: { name: 'gone', tokenHash: 'another-hash', lastSeenAt: new Date(Date.now() - 3_600_000) },
  });
  const model = await db.catalogModel.create({
    data: { name: 'tiny', source: 'http://mirror.example/mirror/tiny/v1/model.gguf', engine: 'llamacpp' },
  });
  const ready = await db.replica.create({
    data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
  });
  await db.engineKey.create({ data: { replicaId: ready.id, key: KEY } });
  await db.replica.create({ data: { modelId: model.id, nodeId: node.id, state: 'STOPPED' } });
  await t.app.services.gateway.routes.refresh();
});

afterAll(async () => {
  await replica?.close();
  await t?.close();
});

describe('GET /metrics', () => {
  it('needs an API token: none, a caller-only one and a node token are refused', async () => {
    expect((await scrape({})).status).toBe(401);
    const made = await t.gql(
      'mutation { createApiToken(input: { name: "calls-only", role: VIEWER, callerOnly: true }) { ... on CreatedApiToken { secret } } }',
      {},
      { token: await t.token('ADMIN') },
    );
    const callerOnly = await scrape({ authorization: `Bearer ${made.data?.createApiToken.secret}` });
    expect(callerOnly.status).toBe(401);
    expect(callerOnly.text).toContain('caller token');
    expect((await scrape({ authorization: 'Bearer hgn_not-a-node' })).status).toBe(401);
    const ok = await scrape();
    expect(ok.status).toBe(200);
    expect(ok.type).toContain('text/plain; version=0.0.4');
  });

  it("gives the mirror's, the fleet's and the replicas' figures as the database has them", async () => {
    const m = parse((await scrape()).text);
    expect(value(m, 'hangar_mirror_files', { state: 'PRESENT' })).toBe(2);
    expect(value(m, 'hangar_mirror_bytes', { state: 'PRESENT' })).toBe(1024);
    expect(value(m, 'hangar_mirror_bytes', { state: 'FETCHING' })).toBe(500);
    expect(value(m, 'hangar_mirror_queue_depth')).toBe(1);
    expect(value(m, 'hangar_mirror_download_bytes_per_second')).toBe(2048);
    expect(value(m, 'hangar_mirror_leases_held')).toBe(1);
    expect(value(m, 'hangar_mirror_failed_files', { reason: 'not_found' })).toBe(1);
    expect(value(m, 'hangar_mirror_failed_files', { reason: 'verification' })).toBe(1);
    expect(value(m, 'hangar_nodes', { online: 'true' })).toBe(1);
    expect(value(m, 'hangar_nodes', { online: 'false' })).toBe(1);
    expect(value(m, 'hangar_node_gpu_memory_bytes', { node: 'gpu-1', gpu: '0', kind: 'total' })).toBe(24_576 * 2 ** 20);
    expect(value(m, 'hangar_node_gpu_memory_bytes', { node: 'gpu-1', gpu: '0', kind: 'free' })).toBe(20_000 * 2 ** 20);
    expect(value(m, 'hangar_replicas', { state: 'READY' })).toBe(1);
    expect(value(m, 'hangar_replicas', { state: 'STOPPED' })).toBe(1);
    expect(value(m, 'hangar_metrics_database_up')).toBe(1);
    expect(m.types.get('hangar_process_resident_memory_bytes')).toBe('gauge');
    expect(m.types.get('hangar_gateway_requests_total')).toBe('counter');
  });

  it("counts the gateway's requests, tokens and latency per model", async () => {
    const caller = await t.token('VIEWER', 'an-application');
    const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: caller, maxRetries: 0 });
    const before = parse((await scrape()).text);
    const requestsBefore = value(before, 'hangar_gateway_requests_total', { model: 'tiny', outcome: 'ok' }) ?? 0;
    for (let i = 0; i < 2; i++) {
      const stream = await openai.chat.completions.create({
        model: 'tiny',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      });
      for await (const _ of stream);
    }
    const m = parse((await scrape()).text);
    expect(value(m, 'hangar_gateway_requests_total', { model: 'tiny', outcome: 'ok' })).toBe(requestsBefore + 2);
    expect(value(m, 'hangar_gateway_tokens_total', { model: 'tiny', kind: 'completion' })).toBeGreaterThan(0);
    expect(m.types.get('hangar_gateway_request_duration_seconds')).toBe('histogram');
    expect(value(m, 'hangar_gateway_request_duration_seconds_count', { model: 'tiny' })).toBe(requestsBefore + 2);
    expect(value(m, 'hangar_gateway_request_duration_seconds_bucket', { model: 'tiny', le: '+Inf' })).toBe(
      requestsBefore + 2,
    );
    expect(value(m, 'hangar_gateway_in_flight_requests')).toBe(0);
  });

  const OTHER_QUERY = { operationName: 'other', operationType: 'query' };

  it("has GraphQL's own figures from Yoga's Prometheus plugin, by the names of Hangar's own documents", async () => {
    // The console's name for its viewer query; a name no client of Hangar's sends is counted as "other".
    await t.gql('query AppLayout_Viewer { viewer { role } }', {}, { token: viewer });
    const before = value(parse((await scrape()).text), 'graphql_envelop_request', OTHER_QUERY) ?? 0;
    await t.gql('query Who { viewer { role } }', {}, { token: viewer });
    const m = parse((await scrape()).text);
    expect(value(m, 'graphql_envelop_request', { operationName: 'AppLayout_Viewer' })).toBeGreaterThanOrEqual(1);
    expect(value(m, 'graphql_envelop_request', OTHER_QUERY)).toBe(before + 1);
    expect(m.samples.some((x) => x.labels.operationName === 'Who')).toBe(false);
  });

  it('keeps GraphQL series bounded: anonymous requests with unique names and query strings add none', async () => {
    // Each request as an anonymous client would send it, over the socket: a name of its own, a query string of
    // its own (the URL), an alias of its own (an error's path), half by GET with the document in the URL.
    let sent = 0;
    const send = async () => {
      const n = `${++sent}x${Math.random().toString(36).slice(2, 8)}`;
      const query = `query Probe_${n} { __typename ok_${n}: __typename denied_${n}: viewer { role } }`;
      const res =
        sent % 2
          ? await fetch(`${base}/graphql?utm_source=leak_${n}`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ query, operationName: `Probe_${n}`, variables: { secret: `leak_${n}` } }),
            })
          : await fetch(
              `${base}/graphql?query=${encodeURIComponent(query)}&operationName=Probe_${n}&utm_source=leak_${n}`,
            );
      await res.arrayBuffer();
    };
    const burst = async (count: number) => {
      const until = sent + count;
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          while (sent < until) await send();
        }),
      );
    };
    const graphqlSeries = (text: string) => parse(text).samples.filter((x) => x.name.startsWith('graphql_')).length;
    await burst(200);
    const early = graphqlSeries((await scrape()).text);
    await burst(1800);
    const text = (await scrape()).text;
    expect(graphqlSeries(text)).toBe(early);
    expect(text).not.toMatch(/Probe_|leak_|ok_|denied_|utm_source/);
    expect(value(parse(text), 'graphql_envelop_request', OTHER_QUERY)).toBeGreaterThanOrEqual(2000);
  }, 120_000);

  it("lists every operation name of the console's, the CLI's and the agent's documents (src/metrics/known-operations.ts)", async () => {
    // A document renamed or added without `pnpm generate` would be counted as "other" from then on.
    const committed = await fs.readFile(knownOperationsFile, 'utf8');
    const names = await findKnownOperations();
    expect(committed, 'server/src/metrics/known-operations.ts is stale: run pnpm generate').toBe(
      printKnownOperations(names),
    );
    expect(names).toContain('AppLayout_Viewer');
    expect(names).toContain('Agent_TrainWork');
    expect(names).toContain('Cli_TrainJobs');
  });

  it('reads values as Prometheus does (the grammar above is itself checked)', () => {
    const m = parse('a Nan\nb +Inf\nc -inf\nd{x="1"} 2.5e3\n');
    expect(value(m, 'a')).toBeNaN();
    expect(value(m, 'b')).toBe(Infinity);
    expect(value(m, 'c')).toBe(-Infinity);
    expect(value(m, 'd', { x: '1' })).toBe(2500);
    expect(() => parse('e twelve\n')).toThrow('not a number');
  });

  it('sorts failures into a few reasons, never the message itself', () => {
    expect(failureClass('connect ECONNREFUSED 10.0.0.1:443')).toBe('upstream');
    expect(failureClass('the upstream answered 503')).toBe('upstream');
    expect(failureClass('the upstream answered 403 Forbidden')).toBe('denied');
    expect(failureClass('ENOSPC: no space left on device')).toBe('disk');
    expect(failureClass('something else')).toBe('other');
  });
});

describe('HANGAR_METRICS_LISTEN', () => {
  it('serves /metrics there without credentials, and no longer on the main port', async () => {
    const own = await startTestApp({ HANGAR_METRICS_LISTEN: '127.0.0.1:0' });
    try {
      const url = await own.app.start();
      const at = own.app.metricsUrl();
      expect(at).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
      const open = await scrape({}, at);
      expect(open.status).toBe(200);
      expect(parse(open.text).types.get('hangar_mirror_files')).toBe('gauge');
      expect((await scrape({}, at?.replace('/metrics', '/graphql'))).status).toBe(404);
      const token = await own.token('ADMIN');
      expect((await scrape({ authorization: `Bearer ${token}` }, `${url}/metrics`)).status).toBe(404);
    } finally {
      await own.close();
    }
  });

  it('refuses a setting that is not host:port, naming it', async () => {
    await expect(startTestApp({ HANGAR_METRICS_LISTEN: 'localhost' })).rejects.toThrow(
      /HANGAR_METRICS_LISTEN="localhost"/,
    );
  });
});
