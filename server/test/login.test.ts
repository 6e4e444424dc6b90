import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADMIN_EMAIL, ADMIN_PASSWORD, startTestApp, type TestApp } from './harness.js';

// Sign-in over real sockets, so the client address is the socket's, as in production. Without a limit a
// guesser got 17–34 tries a second, and each refusal was an audit row that anyone could add without end.

const PASSWORD = 'a password of twelve';
const LOGIN = `mutation($e: String!, $p: String!) {
  login(email: $e, password: $p) {
    __typename
    ... on Error { message code }
    ... on TooManyAttemptsError { retryAfterSeconds }
  }
}`;

type Answer = { __typename: string; message?: string; code?: string; retryAfterSeconds?: number };

let direct: TestApp;
let directUrl: string;
let proxied: TestApp;
let proxiedUrl: string;
beforeAll(async () => {
  [direct, proxied] = await Promise.all([
    startTestApp({ HANGAR_CORS_ORIGINS: 'https://tools.example.com' }),
    startTestApp({ HANGAR_TRUST_PROXY: 'true' }),
  ]);
  [directUrl, proxiedUrl] = await Promise.all([direct.app.start(), proxied.app.start()]);
});
afterAll(() => Promise.all([direct?.close(), proxied?.close()]));

async function signIn(
  base: string,
  email: string,
  password: string,
  headers: Record<string, string> = {},
): Promise<{ answer: Answer; cookies: string[] }> {
  const res = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ query: LOGIN, variables: { e: email, p: password } }),
  });
  const body = (await res.json()) as { data?: { login: Answer }; errors?: unknown };
  if (!body.data) throw new Error(JSON.stringify(body));
  return { answer: body.data.login, cookies: res.headers.getSetCookie() };
}

async function addUser(t: TestApp, email: string) {
  const r = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on Error { message } } }',
    { i: { email, name: email, role: 'VIEWER', password: PASSWORD } },
    await t.login(),
  );
  expect(r.data?.createUser.__typename).toBe('User');
}

const refusedLogins = (t: TestApp, target: string) =>
  t.app.db.prisma.auditEvent.findMany({ where: { action: 'login', outcome: 'REFUSED', target } });

describe('sign-in limits', () => {
  it('takes 10 wrong passwords for one account from one address, then refuses with when to try again', async () => {
    await addUser(direct, 'victim@example.com');
    for (let i = 0; i < 10; i++) {
      const { answer } = await signIn(directUrl, 'victim@example.com', `guess ${i}`);
      expect(answer).toMatchObject({ __typename: 'UnauthenticatedError', message: 'wrong email or password' });
    }
    const { answer } = await signIn(directUrl, 'victim@example.com', 'guess 10');
    expect(answer).toMatchObject({
      __typename: 'TooManyAttemptsError',
      code: 'TOO_MANY_ATTEMPTS',
      message: expect.stringMatching(
        /^too many refused sign-ins for victim@example.com from 127\.0\.0\.1: try again in 1[45] minutes/,
      ),
    });
    expect(answer.retryAfterSeconds).toBeGreaterThan(800);
    expect(answer.retryAfterSeconds).toBeLessThanOrEqual(900);

    // Not even the right password gets through now: it is not checked at all.
    const right = await signIn(directUrl, 'victim@example.com', PASSWORD);
    expect(right.answer.__typename).toBe('TooManyAttemptsError');
    expect(right.cookies).toEqual([]);
    // X-Forwarded-For is anyone's to send; without HANGAR_TRUST_PROXY it does not make a new address.
    const forged = await signIn(directUrl, 'victim@example.com', PASSWORD, { 'x-forwarded-for': '10.9.9.9' });
    expect(forged.answer.__typename).toBe('TooManyAttemptsError');
    // Another account from the same address is not held back by this one.
    expect((await signIn(directUrl, ADMIN_EMAIL, ADMIN_PASSWORD)).answer.__typename).toBe('LoginPayload');

    // One audit row for the lot, counting them.
    const rows = await refusedLogins(direct, 'victim@example.com');
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ actor: 'anonymous', repeats: 13 });
    expect(rows[0]?.message).toMatch(
      /^too many refused sign-ins.*\(13 refused like this from 127\.0\.0\.1 in the quarter hour from \d\d:\d\d UTC\)$/,
    );
  });

  it('counts a burst sent all at once as it arrives: 10 of 30 parallel guesses are checked', async () => {
    await addUser(direct, 'burst@example.com');
    const answers = await Promise.all(
      Array.from({ length: 30 }, (_, i) => signIn(directUrl, 'burst@example.com', `parallel ${i}`)),
    );
    const kinds = answers.map((a) => a.answer.__typename);
    expect(kinds.filter((k) => k === 'UnauthenticatedError')).toHaveLength(10);
    expect(kinds.filter((k) => k === 'TooManyAttemptsError')).toHaveLength(20);
  });

  it('starts the count afresh after the right password', async () => {
    await addUser(direct, 'typo@example.com');
    for (let i = 0; i < 9; i++) await signIn(directUrl, 'typo@example.com', `typo ${i}`);
    expect((await signIn(directUrl, 'typo@example.com', PASSWORD)).answer.__typename).toBe('LoginPayload');
    for (let i = 0; i < 10; i++) {
      expect((await signIn(directUrl, 'typo@example.com', `typo again ${i}`)).answer.__typename).toBe(
        'UnauthenticatedError',
      );
    }
  });

  it('behind a proxy, counts the address it appended, and limits one address over many accounts', async () => {
    // The client wrote the first entry; the proxy appended the last. Only the last is believed.
    const via = (i: number) => ({ 'x-forwarded-for': `${i % 250}.1.2.3, 203.0.113.5` });
    for (let i = 0; i < 100; i++) {
      const { answer } = await signIn(proxiedUrl, `nobody${i}@example.com`, 'spray', via(i));
      expect(answer.__typename).toBe('UnauthenticatedError');
    }
    const { answer } = await signIn(proxiedUrl, 'nobody-else@example.com', 'spray', via(100));
    expect(answer).toMatchObject({
      __typename: 'TooManyAttemptsError',
      message: expect.stringMatching(/^too many refused sign-ins from 203\.0\.113\.5, for any account: try again in/),
    });
    // Refused for the address, a sprayer adds no row per new email: one row counts them all.
    for (let i = 0; i < 5; i++) await signIn(proxiedUrl, `more${i}@example.com`, 'spray', via(i));
    const rows = await proxied.app.db.prisma.auditEvent.findMany({
      where: { action: 'login', message: { startsWith: 'too many refused sign-ins from 203.0.113.5' } },
    });
    expect(rows.map((r) => r.repeats)).toEqual([6]);
    // Another address is its own count.
    const elsewhere = await signIn(proxiedUrl, ADMIN_EMAIL, ADMIN_PASSWORD, { 'x-forwarded-for': '198.18.0.1' });
    expect(elsewhere.answer.__typename).toBe('LoginPayload');
  });

  it('limits one account over many addresses', async () => {
    await addUser(proxied, 'target@example.com');
    for (let i = 0; i < 100; i++) {
      const { answer } = await signIn(proxiedUrl, 'target@example.com', `guess ${i}`, {
        'x-forwarded-for': `198.51.100.${i}`,
      });
      expect(answer.__typename).toBe('UnauthenticatedError');
    }
    const { answer } = await signIn(proxiedUrl, 'target@example.com', 'guess', { 'x-forwarded-for': '192.0.2.1' });
    expect(answer).toMatchObject({
      __typename: 'TooManyAttemptsError',
      message: expect.stringMatching(/^too many refused sign-ins for target@example.com, from many addresses/),
    });
  });
});

describe('sign-in from another site (login CSRF)', () => {
  it('refuses a login form posted by a page of another origin, and sets no cookie', async () => {
    const evil = await signIn(directUrl, ADMIN_EMAIL, ADMIN_PASSWORD, { origin: 'https://evil.example' });
    expect(evil.answer).toMatchObject({
      __typename: 'ForbiddenError',
      message: expect.stringMatching(
        /^sign-in refused: the request came from https:\/\/evil\.example, not from Hangar/,
      ),
    });
    expect(evil.cookies).toEqual([]);

    // A real form: urlencoded, no preflight, from another port of the same host (same cookies, another origin).
    const otherPort = new URL(directUrl);
    otherPort.port = String(Number(otherPort.port) + 1);
    const form = await fetch(`${directUrl}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', origin: otherPort.origin },
      body: new URLSearchParams({
        query: `mutation { login(email: "${ADMIN_EMAIL}", password: "${ADMIN_PASSWORD}") { __typename } }`,
      }).toString(),
    });
    expect(form.headers.getSetCookie()).toEqual([]);
    expect(((await form.json()) as { data: { login: Answer } }).data.login.__typename).toBe('ForbiddenError');

    const hidden = await signIn(directUrl, ADMIN_EMAIL, ADMIN_PASSWORD, { origin: 'null' });
    expect(hidden.answer.__typename).toBe('ForbiddenError');
    const noOrigin = await signIn(directUrl, ADMIN_EMAIL, ADMIN_PASSWORD, { 'sec-fetch-site': 'cross-site' });
    expect(noOrigin.answer.__typename).toBe('ForbiddenError');

    // Refused forms share one audit row, however many are sent.
    const rows = await direct.app.db.prisma.auditEvent.findMany({
      where: { action: 'login', outcome: 'REFUSED', message: { startsWith: 'sign-in refused' } },
    });
    expect(rows).toHaveLength(1);
    expect(rows[0]?.repeats).toBe(4);
  });

  it('takes a sign-in from the console’s own origin, from a listed origin, and from scripts', async () => {
    const own = await signIn(directUrl, ADMIN_EMAIL, ADMIN_PASSWORD, {
      origin: new URL(directUrl).origin,
      'sec-fetch-site': 'same-origin',
    });
    expect(own.answer.__typename).toBe('LoginPayload');
    expect(own.cookies.some((c) => c.startsWith('hangar_session='))).toBe(true);
    const listed = await signIn(directUrl, ADMIN_EMAIL, ADMIN_PASSWORD, { origin: 'https://tools.example.com' });
    expect(listed.answer.__typename).toBe('LoginPayload');
    const script = await signIn(directUrl, ADMIN_EMAIL, ADMIN_PASSWORD);
    expect(script.answer.__typename).toBe('LoginPayload');
  });
});
