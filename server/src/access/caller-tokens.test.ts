import { createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from '../../test/harness.js';

// A caller token is what an operator hands to an application: it calls models at /v1 and is refused everywhere
// else, on every path into the control plane (GraphQL over HTTP, SSE and WebSocket, /mirror, /api), with a
// reason that says what it is for.

let t: TestApp;
let base: string;
let caller: string;
let callerId: string;
let operator: string;
const CALLER_REASON = /the API token "app-caller" is a caller token: it calls models at \/v1 and nothing else/;

const CREATE = `mutation($i: CreateApiTokenInput!) {
  createApiToken(input: $i) {
    __typename
    ... on CreatedApiToken { secret token { id name role callerOnly } }
    ... on Error { message }
  }
}`;

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  operator = await t.token('OPERATOR', 'plain-operator');
  const r = await t.gql(CREATE, { i: { name: 'app-caller', role: 'OPERATOR', callerOnly: true } }, await t.login());
  expect(r.data?.createApiToken).toMatchObject({
    __typename: 'CreatedApiToken',
    token: { name: 'app-caller', role: 'OPERATOR', callerOnly: true },
  });
  caller = r.data?.createApiToken.secret;
  callerId = r.data?.createApiToken.token.id;
  const put = await fetch(`${base}/mirror/weights/v1/model.bin`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${operator}` },
    body: 'some weights',
  });
  expect(put.status).toBe(201);
});
afterAll(() => t.close());

describe('creating a caller token', () => {
  it('is a normal token unless asked; the list and the audit log say which it is', async () => {
    const s = await t.login();
    const plain = await t.gql(CREATE, { i: { name: 'plain-one', role: 'VIEWER' } }, s);
    expect(plain.data?.createApiToken.token.callerOnly).toBe(false);
    const listed = await t.gql('{ apiTokens { name callerOnly } }', {}, s);
    expect(listed.data?.apiTokens).toEqual(
      expect.arrayContaining([
        { name: 'app-caller', callerOnly: true },
        { name: 'plain-one', callerOnly: false },
      ]),
    );
    const audits = await t.app.db.prisma.auditEvent.findMany({
      where: { action: 'createApiToken', target: { in: ['app-caller', 'plain-one'] } },
      orderBy: { id: 'asc' },
    });
    expect(audits.map((a) => [a.target, a.message])).toEqual([
      ['app-caller', 'caller-only (calls models at /v1, nothing else), role OPERATOR, no expiry'],
      ['plain-one', 'role VIEWER, no expiry'],
    ]);
  });

  it('stands for its user when shown to call models', async () => {
    const viewer = await t.app.services.auth.identify({
      authorization: `Bearer ${caller}`,
      method: 'POST',
      purpose: 'call',
    });
    expect(viewer).toMatchObject({ kind: 'token', tokenId: callerId, role: 'OPERATOR', callerOnly: true });
  });
});

describe('a caller token on the control plane', () => {
  it('is refused on GraphQL, saying it is a caller token; a normal token is not', async () => {
    const r = await t.gql('{ nodes { id } }', {}, { token: caller });
    expect(r.errors?.[0]?.message).toMatch(CALLER_REASON);
    expect(r.errors?.[0]?.extensions?.code).toBe('UNAUTHENTICATED');
    const me = await t.gql('{ viewer { role } }', {}, { token: caller });
    expect(me.data?.viewer).toBeNull();
    const mutation = await t.gql(CREATE, { i: { name: 'minted-by-caller', role: 'VIEWER' } }, { token: caller });
    expect(mutation.data?.createApiToken).toMatchObject({ __typename: 'UnauthenticatedError' });
    expect(mutation.data?.createApiToken.message).toMatch(CALLER_REASON);
    expect(await t.app.db.prisma.apiToken.count({ where: { name: 'minted-by-caller' } })).toBe(0);

    const plain = await t.gql('{ viewer { role via } }', {}, { token: operator });
    expect(plain.data?.viewer).toEqual({ role: 'OPERATOR', via: 'token' });
  });

  it('is refused a subscription over SSE, with a 401 and the reason', async () => {
    const res = await fetch(`${base}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'text/event-stream', authorization: `Bearer ${caller}` },
      body: JSON.stringify({ query: 'subscription { auditEventAdded { action } }' }),
    });
    expect(res.status).toBe(401);
    expect(await res.text()).toMatch(/is a caller token/);
  });

  it('is refused a WebSocket, closed with 4403 and the reason; a normal token connects', async () => {
    const connect = (token: string) =>
      new Promise<{ code: number; reason: string } | 'connected'>((resolve) => {
        const client = createClient({
          url: `${base.replace('http', 'ws')}/graphql`,
          webSocketImpl: WebSocket,
          connectionParams: { authorization: `Bearer ${token}` },
          retryAttempts: 0,
          lazy: false,
          on: {
            connected: () => {
              resolve('connected');
              void client.dispose();
            },
            closed: (e) => resolve(e as { code: number; reason: string }),
          },
        });
      });
    const refused = await connect(caller);
    expect(refused).toMatchObject({ code: 4403 });
    expect((refused as { reason: string }).reason).toMatch(/"app-caller" is a caller token/);
    expect(await connect(operator)).toBe('connected');
  });

  it('is refused on GET /mirror with a 401 and the reason; a normal token downloads', async () => {
    const refused = await fetch(`${base}/mirror/weights/v1/model.bin`, {
      headers: { authorization: `Bearer ${caller}` },
    });
    expect(refused.status).toBe(401);
    expect(await refused.text()).toMatch(CALLER_REASON);
    const served = await fetch(`${base}/mirror/weights/v1/model.bin`, {
      headers: { authorization: `Bearer ${operator}` },
    });
    expect(served.status).toBe(200);
    expect(await served.text()).toBe('some weights');
  });

  it('is refused an upload to /mirror', async () => {
    const put = await fetch(`${base}/mirror/weights/v2/model.bin`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${caller}` },
      body: 'other weights',
    });
    expect(put.status).toBe(401);
    expect((await put.json()).error).toMatch(CALLER_REASON);
    expect(await t.app.db.prisma.mirrorFile.count({ where: { model: 'weights', version: 'v2' } })).toBe(0);
  });

  it('is refused on /api/train with a 401 and the reason; a normal token gets its answer', async () => {
    const job = '00000000-0000-4000-8000-000000000000';
    const refused = await fetch(`${base}/api/train/jobs/${job}/artifacts/peft`, {
      headers: { authorization: `Bearer ${caller}` },
    });
    expect(refused.status).toBe(401);
    expect((await refused.json()).error).toMatch(CALLER_REASON);
    const plain = await fetch(`${base}/api/train/jobs/${job}/artifacts/peft`, {
      headers: { authorization: `Bearer ${operator}` },
    });
    expect(plain.status).toBe(404);

    const pairs = `${JSON.stringify({ prompt: 'Say hi.', completion: 'hi' })}\n`;
    const upload = (token: string) =>
      fetch(`${base}/api/train/data`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/x-ndjson' },
        body: pairs,
      });
    const refusedUpload = await upload(caller);
    expect(refusedUpload.status).toBe(401);
    expect((await refusedUpload.json()).error).toMatch(CALLER_REASON);
    expect((await upload(operator)).status).toBe(200);
  });
});

describe('a caller token on a mirror open to anonymous callers', () => {
  it('is answered with the reason, not served as if it had sent nothing', async () => {
    const open = await startTestApp({ HANGAR_MIRROR_REQUIRE_TOKEN: 'false' });
    try {
      const url = await open.app.start();
      const op = await open.token('OPERATOR', 'open-operator');
      const put = await fetch(`${url}/mirror/open/v1/a.bin`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${op}` },
        body: 'open weights',
      });
      expect(put.status).toBe(201);
      const made = await open.gql(
        CREATE,
        { i: { name: 'app-caller', role: 'VIEWER', callerOnly: true } },
        await open.login(),
      );
      const secret = made.data?.createApiToken.secret as string;
      const refused = await fetch(`${url}/mirror/open/v1/a.bin`, { headers: { authorization: `Bearer ${secret}` } });
      expect(refused.status).toBe(401);
      expect(await refused.text()).toMatch(CALLER_REASON);
      // Without a credential the open mirror serves as before.
      const anonymous = await fetch(`${url}/mirror/open/v1/a.bin`);
      expect(anonymous.status).toBe(200);
    } finally {
      await open.close();
    }
  });
});
