import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// OpenTelemetry tracing, end to end: the server's real SDK exports over real HTTP to a stand-in OTLP/HTTP
// collector on loopback (it stands for the site's OpenTelemetry Collector: it accepts POST /v1/traces and keeps
// the JSON the exporter sends), which must see a GraphQL operation's span and a gateway call's, with the model,
// the status and the tokens. Unset, nothing is exported.

type OtlpValue = { stringValue?: string; intValue?: string | number; boolValue?: boolean };
type OtlpSpan = { name: string; attributes?: { key: string; value: OtlpValue }[] };
type OtlpExport = {
  resourceSpans: {
    resource?: { attributes?: { key: string; value: OtlpValue }[] };
    scopeSpans: { spans: OtlpSpan[] }[];
  }[];
};

/** The stand-in collector: every export it received, as parsed JSON. */
async function startCollector() {
  const exports: OtlpExport[] = [];
  const paths: string[] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      paths.push(`${req.method} ${req.url} ${req.headers['content-type']}`);
      if (req.method === 'POST' && req.url === '/v1/traces') exports.push(JSON.parse(body) as OtlpExport);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const spans = () => exports.flatMap((e) => e.resourceSpans.flatMap((r) => r.scopeSpans.flatMap((s) => s.spans)));
  return { url, exports, paths, spans, close: () => new Promise((r) => server.close(r)) };
}

const attr = (span: OtlpSpan, key: string) => {
  const v = span.attributes?.find((a) => a.key === key)?.value;
  return v?.stringValue ?? (v?.intValue === undefined ? v?.boolValue : Number(v.intValue));
};

describe('settings', () => {
  it('is off unless an OTLP endpoint or exporter is named, and follows the SDK for the URL', () => {
    expect(loadConfig({}).tracing).toBeUndefined();
    expect(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318/' }).tracing).toEqual({
      exporter: 'otlp',
      url: 'http://c:4318/v1/traces',
      serviceName: 'hangar',
    });
    expect(
      loadConfig({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://c:4318/t', OTEL_SERVICE_NAME: 'h2' }).tracing,
    ).toEqual({ exporter: 'otlp', url: 'http://c:4318/t', serviceName: 'h2' });
    expect(loadConfig({ OTEL_TRACES_EXPORTER: 'otlp' }).tracing).toMatchObject({
      url: 'http://localhost:4318/v1/traces',
    });
    expect(
      loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_TRACES_EXPORTER: 'none' }).tracing,
    ).toBeUndefined();
    expect(
      loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'true' }).tracing,
    ).toBeUndefined();
    expect(() => loadConfig({ OTEL_TRACES_EXPORTER: 'zipkin' })).toThrow(/OTEL_TRACES_EXPORTER="zipkin"/);
  });
});

describe('with a collector', () => {
  let collector: Awaited<ReturnType<typeof startCollector>>;
  let t: TestApp;
  let stand: StandInReplica;
  const KEY = 'hgk_tracing-stand-in-0123456789abcdef0123';

  beforeAll(async () => {
    collector = await startCollector();
    stand = await startStandInReplica({ key: KEY });
    t = await startTestApp({ OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_SERVICE_NAME: 'hangar-test' });
  });

  afterAll(async () => {
    await t?.close();
    await stand?.close();
    await collector?.close();
  });

  it('exports a span for a GraphQL operation and one for a gateway call, with model, status and tokens', async () => {
    const base = await t.app.start();
    const admin = await t.token('ADMIN', 'tracing-admin');
    const gql = async (query: string, variables: Record<string, unknown> = {}, token = admin) => {
      const r = await t.gql(query, variables, { token });
      expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
      return r.data as Record<string, any>;
    };
    // One model on one stand-in node, READY: what the gateway needs to route a call.
    await t.app.db.prisma.catalogModel.create({
      data: {
        name: 'traced',
        source: 'http://mirror.invalid/traced/v1/config.json',
        engine: 'vllm',
        memoryBytes: 2n ** 30n,
      },
    });
    const node = await gql('mutation { createNode(name: "stand-t") { ... on CreatedNode { token } } }');
    const nodeToken = node.createNode.token as string;
    await gql(
      'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename } }',
      {
        i: {
          gpus: [{ index: 0, name: 'H200', totalMiB: 143_771, freeMiB: 140_000 }],
          engines: [{ name: 'vllm', version: '0.11.0' }],
        },
      },
      nodeToken,
    );
    await t.app.services.fleet.place();
    const mine = await gql('{ nodeAssignments { replicaId model } }', {}, nodeToken);
    const assigned = mine.nodeAssignments.find((a: { model: string }) => a.model === 'traced');
    expect(assigned, 'no replica of traced placed').toBeTruthy();
    await gql(
      'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename } }',
      { i: { replicaId: assigned.replicaId, state: 'READY', endpoint: stand.endpoint, engineKey: KEY } },
      nodeToken,
    );
    await t.app.services.gateway.routes.refresh();

    // Over real HTTP, as a client sends them.
    const graphql = await fetch(`${base}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${admin}` },
      body: JSON.stringify({ query: 'query TracedViewer { viewer { role } }' }),
    });
    expect(graphql.status).toBe(200);
    const chat = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${admin}` },
      body: JSON.stringify({
        model: 'traced',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    expect(chat.status).toBe(200);
    await chat.text();

    // Stopping flushes the batch: the spans of the last requests reach the collector on SIGTERM too.
    await t.app.stop();
    expect(collector.paths.every((p) => p.startsWith('POST /v1/traces'))).toBe(true);
    const spans = collector.spans();
    const op = spans.find((s) => s.name.includes('TracedViewer'));
    expect(op, `no GraphQL span among ${spans.map((s) => s.name).join(', ')}`).toBeTruthy();
    const call = spans.find((s) => s.name === 'POST /v1/chat/completions');
    expect(call, `no gateway span among ${spans.map((s) => s.name).join(', ')}`).toBeTruthy();
    expect(attr(call as OtlpSpan, 'gen_ai.request.model')).toBe('traced');
    expect(attr(call as OtlpSpan, 'http.response.status_code')).toBe(200);
    expect(attr(call as OtlpSpan, 'hangar.outcome')).toBe('ok');
    expect(Number(attr(call as OtlpSpan, 'gen_ai.usage.output_tokens'))).toBeGreaterThan(0);
    const service = collector.exports[0]?.resourceSpans[0]?.resource?.attributes?.find((a) => a.key === 'service.name');
    expect(service?.value.stringValue).toBe('hangar-test');
  }, 60_000);
});

describe('without the variables', () => {
  it('starts no exporter: a GraphQL operation sends nothing', async () => {
    const collector = await startCollector();
    // The settings come from the harness (no OTEL_*); the SDK's exporter also reads process.env by itself, so
    // pointing that at the collector shows no exporter was made anywhere.
    const before = process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
    process.env.OTEL_EXPORTER_OTLP_ENDPOINT = collector.url;
    const t = await startTestApp();
    try {
      const base = await t.app.start();
      const r = await fetch(`${base}/graphql`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ query: 'query Untraced { __typename }' }),
      });
      expect(r.status).toBe(200);
      await t.app.stop();
      expect(collector.paths).toEqual([]);
    } finally {
      if (before === undefined) delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
      else process.env.OTEL_EXPORTER_OTLP_ENDPOINT = before;
      await t.close();
      await collector.close();
    }
  });
});
