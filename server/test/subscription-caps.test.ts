import { type Client, createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from './harness.js';

// A viewer once opened 20,000 subscriptions on one socket and the server's memory went from 0.6 to 1.5 GB.
// Small caps here, so the test needs a handful; the defaults are 100 per connection and 500 per caller.

let t: TestApp;
let url: string;
beforeAll(async () => {
  t = await startTestApp({ HANGAR_MAX_SUBSCRIPTIONS_PER_CONNECTION: '3', HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER: '5' });
  url = await t.app.start();
});
afterAll(() => t.close());

const SUB = 'subscription { auditEventAdded { target } }';

type Outcome = { heard: string[]; refused?: { message: string; code?: unknown }; done: boolean };

function ws(token: string): Client {
  return createClient({
    url: `${url.replace('http', 'ws')}/graphql`,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${token}` },
    retryAttempts: 0,
  });
}

function subscribe(client: Client): { outcome: Outcome; stop: () => void } {
  const outcome: Outcome = { heard: [], done: false };
  const stop = client.subscribe<{ auditEventAdded: { target: string } }>(
    { query: SUB },
    {
      next: (v) => {
        if (v.errors?.length) {
          outcome.refused = { message: v.errors[0]!.message, code: v.errors[0]!.extensions?.code };
        } else if (v.data) outcome.heard.push(v.data.auditEventAdded.target);
      },
      error: (e) => {
        const first = Array.isArray(e) ? e[0] : e;
        outcome.refused = { message: String(first?.message ?? e), code: first?.extensions?.code };
      },
      complete: () => {
        outcome.done = true;
      },
    },
  );
  return { outcome, stop };
}

let events = 0;
/** Creates nodes until every listed subscription has heard one event made after this call. */
async function untilAllHear(outcomes: Outcome[]) {
  for (let i = 0; i < 40; i++) {
    const name = `cap-${++events}-e`;
    await t.gql(`mutation { createNode(name: "${name}") { __typename } }`, {}, { token: admin });
    for (let j = 0; j < 10; j++) {
      if (outcomes.every((o) => o.heard.includes(name))) return;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  throw new Error(`not all heard: ${JSON.stringify(outcomes)}`);
}

async function until(what: string, ok: () => boolean) {
  for (let i = 0; i < 200; i++) {
    if (ok()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`still waiting: ${what}`);
}

let admin: string;
beforeAll(async () => {
  admin = await t.token('ADMIN', 'event-maker');
});

let people = 0;
/** A new VIEWER user; each call of the returned function makes another of their API tokens. */
async function viewerUser() {
  const email = `viewer${++people}@example.com`;
  const password = 'a password of twelve';
  const r = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename } }',
    { i: { email, name: email, role: 'VIEWER', password } },
    { token: admin },
  );
  expect(r.data?.createUser.__typename).toBe('User');
  const session = await t.login(email, password);
  let n = 0;
  return async () => {
    const made = await t.gql(
      'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { ... on CreatedApiToken { secret } } }',
      { i: { name: `token-${++n}`, role: 'VIEWER' } },
      session,
    );
    return made.data?.createApiToken.secret as string;
  };
}

describe('subscription caps', () => {
  it('refuses the subscription past the per-connection cap, and keeps the connection', async () => {
    const client = ws(await (await viewerUser())());
    // Sent at once: the check and the count are one step, so a burst cannot slip past the cap.
    const subs = Array.from({ length: 4 }, () => subscribe(client));
    await until('one refusal', () => subs.some((s) => s.outcome.refused));
    const refused = subs.filter((s) => s.outcome.refused);
    expect(refused).toHaveLength(1);
    expect(refused[0]!.outcome.refused).toEqual({
      code: 'TOO_MANY_SUBSCRIPTIONS',
      message: expect.stringMatching(
        /already has 3 subscriptions open, the most one connection may hold \(HANGAR_MAX_SUBSCRIPTIONS_PER_CONNECTION\)/,
      ),
    });
    const open = subs.filter((s) => !s.outcome.refused);
    await untilAllHear(open.map((s) => s.outcome));

    // The connection stays: once one subscription completes, another fits.
    open[0]!.stop();
    await new Promise((r) => setTimeout(r, 100));
    const again = subscribe(client);
    await untilAllHear([again.outcome, open[1]!.outcome]);
    expect(again.outcome.refused).toBeUndefined();
    await client.dispose();
  });

  it('refuses past the per-caller cap across connections and SSE, caller by caller', async () => {
    // Two tokens of the same user count as one caller.
    const mk = await viewerUser();
    const a = ws(await mk());
    const b = ws(await mk());
    const subsA = Array.from({ length: 3 }, () => subscribe(a));
    const subsB = Array.from({ length: 2 }, () => subscribe(b));
    await untilAllHear([...subsA, ...subsB].map((s) => s.outcome));
    const sse = await fetch(`${url}/graphql`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'text/event-stream',
        authorization: `Bearer ${await mk()}`,
      },
      body: JSON.stringify({ query: SUB }),
    });
    const body = await sse.text();
    expect(body).toMatch(/"code":"TOO_MANY_SUBSCRIPTIONS"/);
    expect(body).toMatch(/already has 5 subscriptions open on this server.*HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER/);

    // Another caller is not held back by this one.
    const otherToken = await (await viewerUser())();
    const c = ws(otherToken);
    const sub = subscribe(c);
    await untilAllHear([sub.outcome]);
    expect(sub.outcome.refused).toBeUndefined();

    await Promise.all([a.dispose(), b.dispose(), c.dispose()]);
  });
});
