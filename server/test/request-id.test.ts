import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type App, createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import type { Database } from '../src/db/database.js';
import { ADMIN_EMAIL, ADMIN_PASSWORD, freshDatabase } from './harness.js';

// A caller's X-Request-Id is the caller's to fill: it must not become the id Hangar files its audit rows and log
// lines under, or a caller could make its rows read as another request's (or as nothing at all). Hangar makes
// its own id for every request; what the caller sent is kept apart, on the log line as clientRequestId, cut to a
// bound and with anything that is not visible ASCII replaced. Sent over a real socket, byte for byte.

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

let database: Database;
let app: App;
let base: URL;
let dataDir: string;
let adminToken: string;
const lines: Record<string, unknown>[] = [];

beforeAll(async () => {
  database = await freshDatabase();
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-request-id-'));
  const config = loadConfig({
    HANGAR_DATA_DIR: dataDir,
    HANGAR_ADMIN_EMAIL: ADMIN_EMAIL,
    HANGAR_ADMIN_PASSWORD: ADMIN_PASSWORD,
    HANGAR_LOG_LEVEL: 'debug',
    PORT: '0',
    HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
  });
  const log = createLogger('debug', (l) => lines.push(JSON.parse(l)));
  app = await createApp({ config, log, database, print: () => {} });
  base = new URL(await app.start());
  // The setup in-process: only the requests under test go over the socket.
  const inProcess = async (query: string, headers: Record<string, string> = {}) =>
    app.yoga.fetch('http://hangar/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ query }),
    });
  const session = await inProcess(
    `mutation { login(email: "${ADMIN_EMAIL}", password: "${ADMIN_PASSWORD}") { ... on LoginPayload { csrfToken } } }`,
  );
  const csrf = ((await session.json()) as any).data.login.csrfToken as string;
  const cookie = session.headers
    .getSetCookie()
    .map((c) => c.split(';')[0])
    .join('; ');
  const created = await inProcess(
    'mutation { createApiToken(input: { name: "rid-admin", role: ADMIN }) { ... on CreatedApiToken { secret } } }',
    { cookie, 'x-hangar-csrf': csrf },
  );
  adminToken = ((await created.json()) as any).data.createApiToken.secret;
});
afterAll(async () => {
  await app?.stop();
  await database?.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

type Answer = { status: number; headers: Record<string, string>; body: string };

/** One POST /graphql over a raw socket: the header's bytes go out exactly as given (latin1), as a client sends. */
function graphql(query: string, headers: Record<string, string> = {}, rawHeader = ''): Promise<Answer> {
  const body = JSON.stringify({ query });
  const head = [
    'POST /graphql HTTP/1.1',
    `host: ${base.host}`,
    'content-type: application/json',
    `content-length: ${Buffer.byteLength(body)}`,
    'connection: close',
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    ...(rawHeader ? [rawHeader] : []),
  ].join('\r\n');
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(base.port), base.hostname);
    const chunks: Buffer[] = [];
    socket.on('data', (c) => chunks.push(c));
    socket.on('error', reject);
    socket.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      const [top = '', ...rest] = text.split('\r\n\r\n');
      const [status = '', ...fields] = top.split('\r\n');
      const parsed: Record<string, string> = {};
      for (const f of fields) {
        const i = f.indexOf(':');
        parsed[f.slice(0, i).toLowerCase()] = f.slice(i + 1).trim();
      }
      let payload = rest.join('\r\n\r\n');
      // Chunked answers: the chunk sizes are dropped, the JSON kept.
      if (parsed['transfer-encoding'] === 'chunked') payload = payload.replace(/(^|\r\n)[0-9a-f]+\r\n/g, '');
      resolve({ status: Number(status.split(' ')[1]), headers: parsed, body: payload.trim() });
    });
    socket.write(Buffer.from(`${head}\r\n\r\n${body}`, 'latin1'));
  });
}

/** Creates a node with `header` as the request's X-Request-Id; the audit row and the edge's log line it left. */
async function auditedWith(name: string, header: string) {
  const answer = await graphql(
    `mutation { createNode(name: "${name}") { __typename } }`,
    { authorization: `Bearer ${adminToken}` },
    `x-request-id: ${header}`,
  );
  expect(answer.status).toBe(200);
  expect(answer.body).toContain('CreatedNode');
  const row = await database.prisma.auditEvent.findFirstOrThrow({ where: { action: 'createNode', target: name } });
  const line = lines.find((l) => l.msg === 'request' && l.requestId === row.requestId);
  return { answer, row, line };
}

describe("a caller's X-Request-Id", () => {
  it('is not the id the audit row and the log line carry: Hangar makes its own, and keeps the caller’s apart', async () => {
    const { answer, row, line } = await auditedWith('rid-forged', 'forged');
    expect(row.requestId).not.toBe('forged');
    expect(row.requestId).toMatch(UUID);
    // The id answered is Hangar's, the one its rows are filed under.
    expect(answer.headers['x-request-id']).toBe(row.requestId);
    expect(line).toMatchObject({ requestId: row.requestId, clientRequestId: 'forged' });
  });

  it('is kept apart with anything but visible ASCII replaced, when it holds control or non-ASCII bytes', async () => {
    // A tab, NEL (0x85: a line break to some log readers), and bytes of no character at all.
    const { row, line } = await auditedWith('rid-control', 'a\tb\x85c\xff\x80d');
    expect(row.requestId).toMatch(UUID);
    expect(line?.clientRequestId).toBe('a?b?c??d');
  });

  it('is cut to 64 characters when it is 10 KB long', async () => {
    const { answer, row, line } = await auditedWith('rid-long', 'x'.repeat(10 * 1024));
    expect(row.requestId).toMatch(UUID);
    expect(answer.headers['x-request-id']).toBe(row.requestId);
    expect(line?.clientRequestId).toBe('x'.repeat(64));
  });

  it('is absent from the line when the caller sent none', async () => {
    const answer = await graphql('{ __typename }');
    const id = answer.headers['x-request-id'];
    expect(id).toMatch(UUID);
    const line = lines.find((l) => l.msg === 'request' && l.requestId === id);
    expect(line).toBeDefined();
    expect(line).not.toHaveProperty('clientRequestId');
  });
});
