import { createLogger } from '@hangar/common/log';
import { type Client, createClient } from 'graphql-ws';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import WebSocket from 'ws';
import { type Ending, LiveCallers } from '../src/auth/live.js';
import { makePubSub } from '../src/pubsub.js';
import { startTestApp, type TestApp } from './harness.js';

// What a credential allows is decided by the user's role now, and ends when the credential does: on the next
// request, and within a second for subscriptions already running, over WebSocket and SSE alike.

let t: TestApp;
let url: string;
beforeAll(async () => {
  t = await startTestApp();
  url = await t.app.start();
});
afterAll(() => t.close());

const PASSWORD = 'a password of twelve';
const SUB = 'subscription { auditEventAdded { action target } }';

let userCount = 0;
/** A new user with the given role, signed in, with an API token of that role made by themselves. */
async function person(role: 'ADMIN' | 'OPERATOR' | 'VIEWER') {
  const email = `person${++userCount}@example.com`;
  const admin = await t.login();
  const created = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on User { id } ... on Error { message } } }',
    { i: { email, name: `Person ${userCount}`, role, password: PASSWORD } },
    admin,
  );
  const id = created.data?.createUser.id as string;
  const session = await t.login(email, PASSWORD);
  const made = await t.gql(
    'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { __typename ... on CreatedApiToken { secret token { id } } } }',
    { i: { name: `${email}-token`, role } },
    session,
  );
  return {
    id,
    email,
    session,
    token: made.data?.createApiToken.secret as string,
    tokenId: made.data?.createApiToken.token.id as string,
  };
}

async function updateUser(id: string, input: Record<string, unknown>) {
  const r = await t.gql(
    'mutation($id: ID!, $i: UpdateUserInput!) { updateUser(id: $id, input: $i) { __typename ... on Error { message } } }',
    { id, i: input },
    await t.login(),
  );
  expect(r.data?.updateUser.__typename).toBe('User');
}

/** Something for the subscriptions to hear: an admin creates a node. */
let nodeCount = 0;
async function makeEvent() {
  const name = `node-${++nodeCount}-e`;
  await t.gql(`mutation { createNode(name: "${name}") { __typename } }`, {}, await t.login());
  return name;
}

type WsWatch = { client: Client; events: string[]; closed: Promise<{ code: number; reason: string }> };

/** A graphql-ws client subscribed to audit events, with the close it ends with. */
async function watchWs(connectionParams: Record<string, unknown>, headers: Record<string, string> = {}) {
  let resolveClosed!: (c: { code: number; reason: string }) => void;
  const closed = new Promise<{ code: number; reason: string }>((r) => {
    resolveClosed = r;
  });
  const events: string[] = [];
  // The console's WebSocket carries the session cookie, as a browser sends it with the upgrade.
  class WithHeaders extends WebSocket {
    constructor(address: string, protocols?: string | string[]) {
      super(address, protocols, { headers });
    }
  }
  const client = createClient({
    url: `${url.replace('http', 'ws')}/graphql`,
    webSocketImpl: WithHeaders,
    connectionParams,
    retryAttempts: 0,
    on: { closed: (e) => resolveClosed(e as { code: number; reason: string }) },
  });
  client.subscribe<{ auditEventAdded: { target: string } }>(
    { query: SUB },
    {
      next: (v) => {
        if (v.data) events.push(v.data.auditEventAdded.target);
      },
      error: () => {},
      complete: () => {},
    },
  );
  // Live first: the subscription must be delivering before the credentials change.
  await untilHeard(() => events.join(' '));
  return { client, events, closed } satisfies WsWatch;
}

type SseWatch = { text: () => string; ended: Promise<void>; abort: () => void; status: number };

/** A real SSE request on the listening server, read until the server ends it. */
async function watchSse(headers: Record<string, string>): Promise<SseWatch> {
  const ctrl = new AbortController();
  const res = await fetch(`${url}/graphql`, {
    method: 'POST',
    signal: ctrl.signal,
    headers: { 'content-type': 'application/json', accept: 'text/event-stream', ...headers },
    body: JSON.stringify({ query: SUB }),
  });
  const reader = res.body!.getReader();
  let text = '';
  const ended = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      text += new TextDecoder().decode(value);
    }
  })().catch(() => {});
  await untilHeard(() => text);
  return { text: () => text, ended, abort: () => ctrl.abort(), status: res.status };
}

/** Makes events until the subscription has heard one (it may not be listening yet when the first is made). */
async function untilHeard(heard: () => string) {
  for (let i = 0; i < 40; i++) {
    const name = await makeEvent();
    for (let j = 0; j < 10; j++) {
      if (heard().includes(`${name}`)) return;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  throw new Error('the subscription heard nothing');
}

/** Ends within the test's time, or says what it was waiting for. */
async function within<T>(what: string, p: Promise<T>, ms = 3000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`still waiting: ${what}`)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

describe('a token after its user is demoted or disabled', () => {
  it('carries the user’s current role, not the one it was made with', async () => {
    const p = await person('ADMIN');
    const before = await t.gql('{ viewer { role } }', {}, { token: p.token });
    expect(before.data?.viewer.role).toBe('ADMIN');
    await updateUser(p.id, { role: 'VIEWER' });

    expect((await t.gql('{ viewer { role } }', {}, { token: p.token })).data?.viewer.role).toBe('VIEWER');
    const createUser = await t.gql(
      'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on Error { message } } }',
      { i: { email: 'backdoor@example.com', name: 'Backdoor', role: 'ADMIN', password: PASSWORD } },
      { token: p.token },
    );
    expect(createUser.data?.createUser).toEqual({
      __typename: 'ForbiddenError',
      message: 'createUser needs the ADMIN role; this caller has VIEWER',
    });
    expect(await t.app.db.prisma.user.count({ where: { email: 'backdoor@example.com' } })).toBe(0);
    const createToken = await t.gql(
      'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { __typename ... on ValidationError { field message } } }',
      { i: { name: 'way-back-up', role: 'ADMIN' } },
      { token: p.token },
    );
    expect(createToken.data?.createApiToken).toMatchObject({ __typename: 'ValidationError', field: 'input.role' });
    expect(await t.app.db.prisma.apiToken.count({ where: { name: 'way-back-up' } })).toBe(0);
  });

  it('is refused, saying why, once its user is disabled', async () => {
    const p = await person('OPERATOR');
    await updateUser(p.id, { disabled: true });
    const r = await t.gql('{ nodes { id } }', {}, { token: p.token });
    expect(r.errors?.[0]?.extensions?.code).toBe('UNAUTHENTICATED');
    expect(r.errors?.[0]?.message).toMatch(/belongs to a disabled user/);
    const session = await t.gql('{ viewer { role } }', {}, p.session);
    expect(session.data?.viewer).toBeNull();
  });
});

describe('live subscriptions end with their credentials', () => {
  it('over WebSocket, when the token is revoked: closed with 4401 and the reason', async () => {
    const p = await person('VIEWER');
    const w = await watchWs({ authorization: `Bearer ${p.token}` });
    await t.gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id: p.tokenId }, p.session);
    const closed = await within('the socket to close', w.closed);
    expect(closed.code).toBe(4401);
    expect(closed.reason).toMatch(/was revoked/);
    await w.client.dispose();
  });

  it('over WebSocket, when the user is disabled', async () => {
    const p = await person('VIEWER');
    const w = await watchWs({ authorization: `Bearer ${p.token}` });
    await updateUser(p.id, { disabled: true });
    const closed = await within('the socket to close', w.closed);
    expect(closed.code).toBe(4401);
    expect(closed.reason).toMatch(/disabled/);
    await w.client.dispose();
  });

  it('over WebSocket, when the user is demoted: 4403, so the client reconnects with the new role', async () => {
    const p = await person('OPERATOR');
    const w = await watchWs({ authorization: `Bearer ${p.token}` });
    await updateUser(p.id, { role: 'VIEWER' });
    const closed = await within('the socket to close', w.closed);
    expect(closed.code).toBe(4403);
    expect(closed.reason).toMatch(/OPERATOR to VIEWER/);
    await w.client.dispose();
  });

  it('over WebSocket, when the console signs out (the session cookie)', async () => {
    const p = await person('VIEWER');
    const w = await watchWs({}, { cookie: p.session.cookie });
    const out = await t.gql('mutation { logout { __typename } }', {}, p.session);
    expect(out.data?.logout.__typename).toBe('LogoutPayload');
    const closed = await within('the socket to close', w.closed);
    expect(closed.code).toBe(4401);
    expect(closed.reason).toMatch(/session has ended/);
    await w.client.dispose();
  });

  it('keeps the subscriptions of the same user’s other credentials', async () => {
    const p = await person('VIEWER');
    const other = await t.gql(
      'mutation { createApiToken(input: { name: "second", role: VIEWER }) { __typename ... on CreatedApiToken { secret } } }',
      {},
      p.session,
    );
    const w = await watchWs({ authorization: `Bearer ${other.data?.createApiToken.secret}` });
    await t.gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id: p.tokenId }, p.session);
    const name = await makeEvent();
    for (let i = 0; i < 200 && !w.events.includes(name); i++) await new Promise((r) => setTimeout(r, 10));
    expect(w.events).toContain(name);
    await w.client.dispose();
  });

  it('over SSE, when the token is revoked: the stream ends, its last event saying why', async () => {
    const p = await person('VIEWER');
    const s = await watchSse({ authorization: `Bearer ${p.token}` });
    await t.gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id: p.tokenId }, p.session);
    await within('the stream to end', s.ended);
    expect(s.text()).toMatch(/subscription ended: the API token .* was revoked/);
    expect(s.text()).toContain('event: complete');
  });

  it('over SSE, when the user is disabled', async () => {
    const p = await person('VIEWER');
    const s = await watchSse({ authorization: `Bearer ${p.token}` });
    await updateUser(p.id, { disabled: true });
    await within('the stream to end', s.ended);
    expect(s.text()).toMatch(/belongs to a disabled user/);
  });

  it('over SSE, when the user is demoted', async () => {
    const p = await person('OPERATOR');
    const s = await watchSse({ authorization: `Bearer ${p.token}` });
    await updateUser(p.id, { role: 'VIEWER' });
    await within('the stream to end', s.ended);
    expect(s.text()).toMatch(/the role changed from OPERATOR to VIEWER/);
  });

  it('over SSE, when the console signs out', async () => {
    const p = await person('VIEWER');
    const s = await watchSse({ cookie: p.session.cookie, 'x-hangar-csrf': p.session.csrf });
    await t.gql('mutation { logout { __typename } }', {}, p.session);
    await within('the stream to end', s.ended);
    expect(s.text()).toMatch(/the session has ended/);
  });

  it('ends a connection whose token expires, on the periodic check (an expiry sends no event)', async () => {
    const p = await person('VIEWER');
    const live = new LiveCallers({
      auth: t.app.services.auth,
      pubsub: makePubSub(),
      log: createLogger('silent'),
      limits: { perConnection: 10, perCaller: 10 },
      recheckEveryMs: 100,
    });
    live.start();
    const credentials = { authorization: `Bearer ${p.token}`, method: 'GET' };
    const viewer = await t.app.services.auth.identify(credentials);
    expect(viewer.kind).toBe('token');
    const ended = new Promise<Ending>((resolve) => live.open(viewer, credentials, resolve));
    await t.app.db.prisma.apiToken.update({
      where: { id: p.tokenId },
      data: { expiresAt: new Date(Date.now() - 1000) },
    });
    const ending = await within('the periodic check', ended);
    live.stop();
    expect(ending.code).toBe(4401);
    expect(ending.message).toMatch(/expired on/);
  });

  it('refuses an anonymous SSE subscription at once, with a 401, instead of holding it open', async () => {
    const res = await fetch(`${url}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ query: SUB }),
    });
    expect(res.status).toBe(401);
    // The whole answer arrives and the stream ends: text() would hang on a stream held open.
    const body = await within('the response to end', res.text());
    expect(body).toMatch(/"code":"UNAUTHENTICATED"/);
    expect(body).toContain('event: complete');
  });
});

// AuthService keeps an identified token or session for a few seconds (auth/credential-cache.ts). Each test
// below first makes sure the credential is kept (a request that reads none of its tables), then changes it and
// expects the very next request refused.
describe('with identified credentials kept for a few seconds', () => {
  const VIEWER = '{ viewer { role user { email } } }';

  /** The SQL statements on the credential tables that `run` makes (the tables a lookup reads). */
  async function credentialQueries(run: () => Promise<unknown>): Promise<string[]> {
    const spy = vi.spyOn(pg.Client.prototype, 'query');
    try {
      await run();
      return spy.mock.calls
        .map(([q]) => (typeof q === 'string' ? q : (q as { text?: string }).text) ?? '')
        .filter((sql) => /"(ApiToken|Session|User)"/.test(sql));
    } finally {
      spy.mockRestore();
    }
  }

  async function keptToken(token: string) {
    expect((await t.gql(VIEWER, {}, { token })).data?.viewer.role).toBeDefined();
    const again = await credentialQueries(() => t.gql(VIEWER, {}, { token }));
    expect(again).toEqual([]);
  }

  it('answers a kept token, and the viewer’s user, without a database round-trip', async () => {
    const p = await person('OPERATOR');
    await t.gql(VIEWER, {}, { token: p.token });
    const answers: { data?: { viewer?: unknown } }[] = [];
    const sql = await credentialQueries(async () => answers.push(await t.gql(VIEWER, {}, { token: p.token })));
    expect(answers[0]?.data?.viewer).toEqual({ role: 'OPERATOR', user: { email: p.email } });
    expect(sql).toEqual([]);
    // A field identifying did not load still comes from the database.
    const more = await credentialQueries(() =>
      t.gql('{ viewer { user { email createdAt } } }', {}, { token: p.token }),
    );
    expect(more).toHaveLength(1);
  });

  it('answers the viewer’s new name on the very next request once it is renamed', async () => {
    const p = await person('VIEWER');
    await keptToken(p.token);
    await updateUser(p.id, { name: 'Renamed Person' });
    const r = await t.gql('{ viewer { user { name } } }', {}, { token: p.token });
    expect(r.data?.viewer.user.name).toBe('Renamed Person');
  });

  it('refuses a kept token on the very next request once it is revoked', async () => {
    const p = await person('VIEWER');
    await keptToken(p.token);
    await t.gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id: p.tokenId }, p.session);
    const r = await t.gql('{ nodes { id } }', {}, { token: p.token });
    expect(r.errors?.[0]?.extensions?.code).toBe('UNAUTHENTICATED');
    expect(r.errors?.[0]?.message).toMatch(/was revoked/);
  });

  it('refuses a kept token on the very next request once its user is disabled', async () => {
    const p = await person('OPERATOR');
    await keptToken(p.token);
    await updateUser(p.id, { disabled: true });
    const r = await t.gql('{ nodes { id } }', {}, { token: p.token });
    expect(r.errors?.[0]?.message).toMatch(/belongs to a disabled user/);
  });

  it('carries the lower role on the very next request once its user is demoted', async () => {
    const p = await person('ADMIN');
    await keptToken(p.token);
    await updateUser(p.id, { role: 'VIEWER' });
    expect((await t.gql('{ viewer { role } }', {}, { token: p.token })).data?.viewer.role).toBe('VIEWER');
  });

  it('refuses a kept session on the very next request once it signs out, and checks CSRF on every hit', async () => {
    const p = await person('VIEWER');
    expect((await t.gql(VIEWER, {}, p.session)).data?.viewer.role).toBe('VIEWER');
    expect(await credentialQueries(() => t.gql(VIEWER, {}, p.session))).toEqual([]);
    const forged = await t.gql('{ nodes { id } }', {}, { cookie: p.session.cookie, csrf: 'not-the-token' });
    expect(forged.errors?.[0]?.message).toMatch(/without its CSRF token/);
    const bare = await t.gql('{ nodes { id } }', {}, { cookie: p.session.cookie });
    expect(bare.errors?.[0]?.message).toMatch(/without its CSRF token/);
    expect((await t.gql(VIEWER, {}, p.session)).data?.viewer.role).toBe('VIEWER');
    await t.gql('mutation { logout { __typename } }', {}, p.session);
    expect((await t.gql(VIEWER, {}, p.session)).data?.viewer).toBeNull();
  });

  it('refuses a kept token at its expiry (an expiry sends no event)', async () => {
    const p = await person('VIEWER');
    const expiresAt = new Date(Date.now() + 1500);
    const made = await t.gql(
      'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { __typename ... on CreatedApiToken { secret } ... on Error { message } } }',
      { i: { name: 'short-lived', role: 'VIEWER', expiresAt: expiresAt.toISOString() } },
      p.session,
    );
    const token = made.data?.createApiToken.secret as string;
    expect(token, JSON.stringify(made)).toBeTruthy();
    await keptToken(token);
    await new Promise((r) => setTimeout(r, expiresAt.getTime() - Date.now() + 10));
    const r = await t.gql('{ nodes { id } }', {}, { token });
    expect(r.errors?.[0]?.message).toMatch(/expired on/);
  });
});
