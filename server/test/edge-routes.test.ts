import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type App, createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { statusOf } from '../src/http/reply.js';
import {
  ConflictError,
  ForbiddenError,
  NotFoundError,
  UnauthenticatedError,
  UnprocessableError,
  UpstreamError,
  ValidationError,
} from '../src/lib/errors.js';
import { ADMIN_EMAIL, ADMIN_PASSWORD, freshDatabase } from './harness.js';

// The HTTP edge (http/routes.ts): one request id per request, made once and carried by the answer, every log
// line and every audit row of that request; and one table from typed errors to statuses.

describe('the status of each typed error', () => {
  it('answers each code with the status a script branches on', () => {
    // NOT_FOUND was a 400 on /mirror uploads: a script could not tell "no such thing" from "bad input".
    expect(statusOf(new NotFoundError('no such version'))).toBe(404);
    expect(statusOf(new ValidationError('sha256', 'bad'))).toBe(400);
    expect(statusOf(new ConflictError('taken'))).toBe(409);
    expect(statusOf(new UnauthenticatedError('who'))).toBe(401);
    expect(statusOf(new ForbiddenError('no'))).toBe(403);
    expect(statusOf(new UnprocessableError('a bad tar'))).toBe(422);
    expect(statusOf(new UpstreamError('the Hub is away'))).toBe(502);
  });
});

type Line = { level: string; msg: string; requestId?: string; [k: string]: unknown };

describe('one request id per request', () => {
  const lines: Line[] = [];
  let app: App;
  let url: string;
  let dataDir: string;
  let operator: string;
  let viewer: string;

  const gql = async (query: string, variables: Record<string, unknown>, headers: Record<string, string> = {}) => {
    const body = JSON.stringify({ query, variables });
    const r = await app.yoga.fetch('http://hangar/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), ...headers },
      body,
    });
    return { headers: r.headers, json: (await r.json()) as { data?: any } };
  };

  beforeAll(async () => {
    const database = await freshDatabase();
    dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-data-'));
    const config = loadConfig({
      HANGAR_DATA_DIR: dataDir,
      HANGAR_ADMIN_EMAIL: ADMIN_EMAIL,
      HANGAR_ADMIN_PASSWORD: ADMIN_PASSWORD,
      HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
      PORT: '0',
    });
    const write = (l: string) => void lines.push(JSON.parse(l) as Line);
    app = await createApp({ config, log: createLogger('debug', write), database, print: () => {} });
    url = await app.start();
    const login = await gql(
      'mutation($e: String!, $p: String!) { login(email: $e, password: $p) { ... on LoginPayload { csrfToken } } }',
      { e: ADMIN_EMAIL, p: ADMIN_PASSWORD },
    );
    const session = {
      cookie: login.headers
        .getSetCookie()
        .map((c) => c.split(';')[0])
        .join('; '),
      'x-hangar-csrf': login.json.data.login.csrfToken as string,
    };
    const token = async (role: string) =>
      (
        await gql(
          'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { ... on CreatedApiToken { secret } } }',
          { i: { name: `edge-${role.toLowerCase()}`, role } },
          session,
        )
      ).json.data.createApiToken.secret as string;
    operator = await token('OPERATOR');
    viewer = await token('VIEWER');
  });
  afterAll(async () => {
    await app.stop();
    await fs.rm(dataDir, { recursive: true, force: true });
  });

  const put = (file: string, token: string, headers: Record<string, string> = {}) =>
    fetch(`${url}/mirror/edge/v1/${file}`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${token}`, ...headers },
      body: new Uint8Array(Buffer.from('the bytes of one upload')),
    });

  it('gives an upload one id: its answer, every log line of it and its audit row carry the same', async () => {
    const from = lines.length;
    const r = await put('one.bin', operator);
    expect(r.status).toBe(201);
    const id = r.headers.get('x-request-id');
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    const audit = await app.db.prisma.auditEvent.findFirstOrThrow({
      where: { action: 'uploadToMirror', target: 'edge/v1/one.bin' },
    });
    expect(audit).toMatchObject({ outcome: 'DONE', requestId: id });
    const ours = lines.slice(from).filter((l) => l.requestId === id);
    // The edge's line for the request and the route's own, both under the answer's id.
    expect(ours.map((l) => l.msg)).toEqual(expect.arrayContaining(['mirror: upload kept', 'request']));
    expect(ours.find((l) => l.msg === 'request')).toMatchObject({ route: 'mirror upload', status: 201 });
    // No line of this upload under any other id.
    const others = lines.slice(from).filter((l) => l.requestId && l.requestId !== id && /upload/.test(l.msg));
    expect(others).toEqual([]);
  });

  it("audits a refused upload under the answer's id, Hangar's own, never a caller's x-request-id", async () => {
    const r = await put('two.bin', viewer, { 'x-request-id': 'proxy-abc-123' });
    expect(r.status).toBe(403);
    const id = r.headers.get('x-request-id');
    expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    const audit = await app.db.prisma.auditEvent.findFirstOrThrow({
      where: { action: 'uploadToMirror', target: 'edge/v1/two.bin' },
    });
    expect(audit).toMatchObject({ outcome: 'REFUSED', requestId: id });
  });

  it('answers a conflicting upload with 409 and its code, under the same id as its audit row', async () => {
    const r = await put('one.bin', operator);
    expect(r.status).toBe(409);
    expect(await r.json()).toMatchObject({ code: 'CONFLICT' });
    const audit = await app.db.prisma.auditEvent.findFirstOrThrow({
      where: { action: 'uploadToMirror', target: 'edge/v1/one.bin', outcome: 'REFUSED' },
    });
    expect(audit.requestId).toBe(r.headers.get('x-request-id'));
  });

  it("files a refused adapter upload under the answer's id, as the mirror's are", async () => {
    const job = '00000000-0000-4000-8000-000000000016';
    const r = await fetch(`${url}/api/train/jobs/${job}/artifacts/peft`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}` },
      body: 'not a tar',
    });
    expect(r.status).toBe(403);
    const audit = await app.db.prisma.auditEvent.findFirstOrThrow({
      where: { action: 'uploadTrainArtifact', target: `job ${job}` },
    });
    expect(audit).toMatchObject({ outcome: 'REFUSED', requestId: r.headers.get('x-request-id') });
  });
});
