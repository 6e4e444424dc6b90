import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADMIN_EMAIL, startTestApp, type TestApp } from '../../test/harness.js';

let t: TestApp;
beforeAll(async () => {
  t = await startTestApp();
});
afterAll(() => t.close());

const LOGIN = `mutation($e: String!, $p: String!) {
  login(email: $e, password: $p) { __typename ... on Error { message code } ... on ValidationError { field } }
}`;
const VIEWER = '{ viewer { role via tokenName user { email } } }';

const lastAudit = async () => (await t.app.db.prisma.auditEvent.findMany({ orderBy: { id: 'desc' }, take: 1 }))[0];

describe('signing in', () => {
  it('creates the first admin from HANGAR_ADMIN_EMAIL and HANGAR_ADMIN_PASSWORD, once', async () => {
    const users = await t.app.db.prisma.user.findMany();
    expect(users.map((u) => [u.email, u.role])).toEqual([[ADMIN_EMAIL, 'ADMIN']]);
    expect(users[0]?.passwordHash).toMatch(/^\$argon2id\$/);
    await t.app.services.auth.ensureFirstAdmin(() => {});
    expect(await t.app.db.prisma.user.count()).toBe(1);
  });

  it('refuses a wrong password with a typed error, and audits the refusal', async () => {
    const r = await t.gql(LOGIN, { e: ADMIN_EMAIL, p: 'not the password' });
    expect(r.data?.login).toEqual({
      __typename: 'UnauthenticatedError',
      message: 'wrong email or password',
      code: 'UNAUTHENTICATED',
    });
    expect(r.headers.getSetCookie()).toEqual([]);
    expect(await lastAudit()).toMatchObject({
      action: 'login',
      outcome: 'REFUSED',
      target: ADMIN_EMAIL,
      actor: 'anonymous',
    });
  });

  it('says which field is malformed', async () => {
    const r = await t.gql(LOGIN, { e: 'not-an-email', p: 'x' });
    expect(r.data?.login).toMatchObject({ __typename: 'ValidationError', field: 'email' });
  });

  it('sets an HttpOnly session cookie and a readable CSRF cookie', async () => {
    const r = await t.gql(LOGIN, { e: ADMIN_EMAIL, p: 'correct-horse-battery' });
    expect(r.data?.login.__typename).toBe('LoginPayload');
    const cookies = r.headers.getSetCookie();
    const session = cookies.find((c) => c.startsWith('hangar_session='));
    const csrf = cookies.find((c) => c.startsWith('hangar_csrf='));
    expect(session).toMatch(/HttpOnly/);
    expect(session).toMatch(/SameSite=Lax/);
    expect(session).not.toMatch(/Secure/);
    expect(csrf).not.toMatch(/HttpOnly/);
    expect(await lastAudit()).toMatchObject({ action: 'login', outcome: 'DONE', actor: `user:${ADMIN_EMAIL}` });
  });

  it('marks cookies Secure behind https', async () => {
    const r = await t.gql(
      LOGIN,
      { e: ADMIN_EMAIL, p: 'correct-horse-battery' },
      { headers: { 'x-forwarded-proto': 'https' } },
    );
    expect(r.headers.getSetCookie().every((c) => c.includes('Secure'))).toBe(true);
  });

  it("keeps the browser's user agent with the session, and ends the session the cookie named on sign-out", async () => {
    // The service sees the agent only as the edge hands it over (auth/actor.ts): the header is read there.
    const agent = 'Mozilla/5.0 (X11; Linux x86_64) Hangar-test';
    const r = await t.gql(LOGIN, { e: ADMIN_EMAIL, p: 'correct-horse-battery' }, { headers: { 'user-agent': agent } });
    expect(r.data?.login.__typename).toBe('LoginPayload');
    const newest = await t.app.db.prisma.session.findFirstOrThrow({ orderBy: { createdAt: 'desc' } });
    expect(newest.userAgent).toBe(agent);

    const cookies = r.headers.getSetCookie().map((c) => c.split(';')[0]);
    const csrf = cookies.find((c) => c?.startsWith('hangar_csrf='))?.split('=')[1];
    const out = await t.gql('mutation { logout { __typename ... on LogoutPayload { ok } } }', undefined, {
      cookie: cookies.join('; '),
      csrf,
    });
    expect(out.data?.logout).toEqual({ __typename: 'LogoutPayload', ok: true });
    expect(out.headers.getSetCookie().every((c) => c.includes('Max-Age=0'))).toBe(true);
    expect(out.headers.getSetCookie()).toHaveLength(2);
    expect(await t.app.db.prisma.session.findUnique({ where: { id: newest.id } })).toBeNull();
  });

  it('takes the session cookie only with its CSRF header', async () => {
    const { cookie, csrf } = await t.login();
    const withCsrf = await t.gql(VIEWER, {}, { cookie, csrf });
    expect(withCsrf.data?.viewer).toEqual({
      role: 'ADMIN',
      via: 'session',
      tokenName: null,
      user: { email: ADMIN_EMAIL },
    });
    const forged = await t.gql(VIEWER, {}, { cookie });
    expect(forged.data?.viewer).toBeNull();
    const refused = await t.gql(
      'mutation { createNode(name: "n1") { __typename ... on Error { message } } }',
      {},
      { cookie },
    );
    expect(refused.data?.createNode.__typename).toBe('UnauthenticatedError');
    expect(refused.data?.createNode.message).toMatch(/CSRF/);
  });

  it('ends the session on logout', async () => {
    const s = await t.login();
    const r = await t.gql('mutation { logout { __typename ... on LogoutPayload { ok } } }', {}, s);
    expect(r.data?.logout).toEqual({ __typename: 'LogoutPayload', ok: true });
    expect((await t.gql(VIEWER, {}, s)).data?.viewer).toBeNull();
  });
});

describe('API tokens', () => {
  const CREATE = `mutation($i: CreateApiTokenInput!) {
    createApiToken(input: $i) {
      __typename
      ... on CreatedApiToken { secret token { id name role prefix active } }
      ... on Error { message }
      ... on ValidationError { field }
    }
  }`;

  it('shows the secret once and keeps only its hash', async () => {
    const s = await t.login();
    const r = await t.gql(CREATE, { i: { name: 'ci-deploy', role: 'OPERATOR' } }, s);
    const created = r.data?.createApiToken;
    expect(created.__typename).toBe('CreatedApiToken');
    expect(created.secret).toMatch(/^hgr_/);
    expect(created.secret.startsWith(created.token.prefix)).toBe(true);
    const row = await t.app.db.prisma.apiToken.findUniqueOrThrow({ where: { id: created.token.id } });
    expect(JSON.stringify(row)).not.toContain(created.secret);
    const listed = await t.gql('{ apiTokens { name } }', {}, s);
    expect(JSON.stringify(listed.data)).not.toContain(created.secret);

    const me = await t.gql(VIEWER, {}, { token: created.secret });
    expect(me.data?.viewer).toEqual({
      role: 'OPERATOR',
      via: 'token',
      tokenName: 'ci-deploy',
      user: { email: ADMIN_EMAIL },
    });
    const used = await t.app.db.prisma.apiToken.findUniqueOrThrow({ where: { id: created.token.id } });
    expect(used.lastUsedAt).not.toBeNull();
  });

  // Viewer.user answers from what identifying the caller loaded when that is all it is asked; anything more
  // (a field not kept, a relation) comes from the database.
  it("answers the viewer's own fields and relations beyond what identifying loaded", async () => {
    const s = await t.login();
    const r = await t.gql(CREATE, { i: { name: 'viewer-relations', role: 'VIEWER' } }, s);
    const secret = r.data?.createApiToken.secret as string;
    const me = await t.gql(
      '{ viewer { user { email createdAt disabled apiTokens { name owner { email } } } } }',
      {},
      { token: secret },
    );
    const user = me.data?.viewer.user;
    expect(user.email).toBe(ADMIN_EMAIL);
    expect(user.disabled).toBe(false);
    expect(Number.isNaN(Date.parse(user.createdAt))).toBe(false);
    expect(user.apiTokens).toContainEqual({ name: 'viewer-relations', owner: { email: ADMIN_EMAIL } });
  });

  it('never gives a token more than its maker has', async () => {
    const viewer = await t.token('VIEWER', 'read-only');
    const r = await t.gql(CREATE, { i: { name: 'escalate', role: 'ADMIN' } }, { token: viewer });
    expect(r.data?.createApiToken).toMatchObject({ __typename: 'ValidationError', field: 'input.role' });
    expect(await t.app.db.prisma.apiToken.count({ where: { name: 'escalate' } })).toBe(0);
  });

  it('refuses a revoked token and says why', async () => {
    const secret = await t.token('OPERATOR', 'to-revoke');
    const s = await t.login();
    const id = (await t.app.db.prisma.apiToken.findFirstOrThrow({ where: { name: 'to-revoke' } })).id;
    const r = await t.gql(
      'mutation($id: ID!) { revokeApiToken(id: $id) { __typename ... on ApiToken { active revokedAt } } }',
      { id },
      s,
    );
    expect(r.data?.revokeApiToken).toMatchObject({ __typename: 'ApiToken', active: false });
    const after = await t.gql('{ nodes { id } }', {}, { token: secret });
    expect(after.errors?.[0]?.message).toMatch(/revoked/);
    expect(after.errors?.[0]?.extensions?.code).toBe('UNAUTHENTICATED');
  });

  it('refuses an expired token and says when it expired', async () => {
    const secret = await t.token('OPERATOR', 'short-lived');
    await t.app.db.prisma.apiToken.updateMany({
      where: { name: 'short-lived' },
      data: { expiresAt: new Date(Date.now() - 1000) },
    });
    const r = await t.gql('{ nodes { id } }', {}, { token: secret });
    expect(r.errors?.[0]?.message).toMatch(/short-lived" expired on/);
  });

  it('refuses an expiry in the past', async () => {
    const s = await t.login();
    const r = await t.gql(CREATE, { i: { name: 'past', role: 'VIEWER', expiresAt: '2001-01-01T00:00:00Z' } }, s);
    expect(r.data?.createApiToken).toMatchObject({ __typename: 'ValidationError', field: 'input.expiresAt' });
  });

  it('refuses a malformed Authorization header instead of ignoring it', async () => {
    const r = await t.gql('{ nodes { id } }', {}, { headers: { authorization: 'Token abc' } });
    expect(r.errors?.[0]?.message).toMatch(/Bearer/);
  });
});

describe('roles', () => {
  it('lets a viewer read and refuses its mutations, typed and audited', async () => {
    const viewer = await t.token('VIEWER', 'viewer-script');
    expect(
      (await t.gql('{ nodes { id } auditEvents(first: 1) { edges { cursor } } }', {}, { token: viewer })).errors,
    ).toBeUndefined();
    const r = await t.gql(
      'mutation { createNode(name: "gpu-9") { __typename ... on Error { message code } } }',
      {},
      { token: viewer },
    );
    expect(r.data?.createNode).toEqual({
      __typename: 'ForbiddenError',
      code: 'FORBIDDEN',
      message: 'createNode needs the ADMIN role; this caller has VIEWER',
    });
    expect(await lastAudit()).toMatchObject({
      action: 'createNode',
      target: 'gpu-9',
      outcome: 'REFUSED',
      actor: `token:viewer-script (${ADMIN_EMAIL})`,
    });
    expect(await t.app.db.prisma.node.count({ where: { name: 'gpu-9' } })).toBe(0);
  });

  it('gives an admin the node token once', async () => {
    const admin = await t.token('ADMIN', 'admin-script');
    const r = await t.gql(
      'mutation { createNode(name: "gpu-1") { __typename ... on CreatedNode { token node { name online } } } }',
      {},
      { token: admin },
    );
    expect(r.data?.createNode.token).toMatch(/^hgn_/);
    expect(r.data?.createNode.node).toEqual({ name: 'gpu-1', online: false });
    const again = await t.gql(
      'mutation { createNode(name: "gpu-1") { __typename ... on Error { message } } }',
      {},
      { token: admin },
    );
    expect(again.data?.createNode).toEqual({
      __typename: 'ConflictError',
      message: 'a node named gpu-1 already exists',
    });
    const bad = await t.gql(
      'mutation { createNode(name: "../etc") { __typename ... on ValidationError { field message } } }',
      {},
      { token: admin },
    );
    expect(bad.data?.createNode).toMatchObject({ __typename: 'ValidationError', field: 'name' });
    expect(bad.data?.createNode.message).toMatch(/letters, digits/);
  });

  it('keeps the last admin', async () => {
    const s = await t.login();
    const admin = await t.app.db.prisma.user.findUniqueOrThrow({ where: { email: ADMIN_EMAIL } });
    const r = await t.gql(
      'mutation($id: ID!) { updateUser(id: $id, input: { role: VIEWER }) { __typename ... on Error { message } } }',
      { id: admin.id },
      s,
    );
    expect(r.data?.updateUser).toEqual({
      __typename: 'ConflictError',
      message: `${ADMIN_EMAIL} is the last admin: make another user an admin first`,
    });
  });

  it('lets an admin create a user who can then sign in with their own role', async () => {
    const s = await t.login();
    const r = await t.gql(
      'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on User { email role } ... on Error { message } } }',
      { i: { email: 'Op@Example.com', name: 'Op', role: 'OPERATOR', password: 'twelve chars!' } },
      s,
    );
    expect(r.data?.createUser).toEqual({ __typename: 'User', email: 'op@example.com', role: 'OPERATOR' });
    const op = await t.login('op@example.com', 'twelve chars!');
    expect((await t.gql(VIEWER, {}, op)).data?.viewer.role).toBe('OPERATOR');
    const users = await t.gql('{ users { email } }', {}, op);
    expect(users.errors?.[0]?.extensions?.code).toBe('FORBIDDEN');
  });
});
