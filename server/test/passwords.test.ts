import { createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { ADMIN_PASSWORD, startTestApp, type TestApp } from './harness.js';

// A password changed by its owner, or reset by an admin, is the end of whatever the old one opened: the other
// sessions at once, and the live views opened with them within a moment. The session that changed it stays.

let t: TestApp;
let url: string;
beforeAll(async () => {
  t = await startTestApp();
  url = await t.app.start();
});
afterAll(() => t.close());

const OLD = 'the first password';
const NEW = 'the second password';
const CHANGE = `mutation($i: ChangePasswordInput!) {
  changePassword(input: $i) {
    __typename ... on PasswordChanged { signedOut } ... on Error { message } ... on ValidationError { field }
  }
}`;

let count = 0;
async function person() {
  const email = `pw${++count}@example.com`;
  const r = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { ... on User { id } ... on Error { message } } }',
    { i: { email, name: email, role: 'OPERATOR', password: OLD } },
    await t.login(),
  );
  return { id: r.data?.createUser.id as string, email };
}

/** A live subscription over the console's WebSocket (the session cookie rides on the upgrade), and how it ends. */
function live(session: { cookie: string }) {
  let opened!: () => void;
  const listening = new Promise<void>((r) => {
    opened = r;
  });
  const ended = new Promise<string>((resolve) => {
    class WithCookie extends WebSocket {
      constructor(address: string, protocols?: string | string[]) {
        super(address, protocols, { headers: { cookie: session.cookie } });
      }
    }
    const client = createClient({
      url: `${url.replace('http', 'ws')}/graphql`,
      webSocketImpl: WithCookie,
      retryAttempts: 0,
      lazy: false,
      on: { connected: () => opened(), closed: (e) => resolve(`closed ${(e as { code: number }).code}`) },
    });
    client.subscribe(
      { query: 'subscription { auditEventAdded { action } }' },
      { next: () => {}, error: () => resolve('error'), complete: () => resolve('complete') },
    );
  });
  return { listening, ended };
}

async function signedIn(session: { cookie: string; csrf: string }) {
  return (await t.gql('{ viewer { user { email } } }', {}, session)).data?.viewer?.user.email as string | undefined;
}

function within<T>(what: string, p: Promise<T>, ms = 5000): Promise<T> {
  return Promise.race([
    p,
    new Promise<never>((_, no) => setTimeout(() => no(new Error(`still waiting: ${what}`)), ms)),
  ]);
}

describe('changing your own password', () => {
  it('needs the current one, signs out the other sessions and their live views, and keeps this one', async () => {
    const p = await person();
    const here = await t.login(p.email, OLD);
    const elsewhere = await t.login(p.email, OLD);
    const watching = live(elsewhere);
    await within('the other session to go live', watching.listening);

    const wrong = await t.gql(CHANGE, { i: { currentPassword: 'not my password', newPassword: NEW } }, here);
    expect(wrong.data?.changePassword).toEqual({
      __typename: 'ValidationError',
      field: 'input.currentPassword',
      message: 'input.currentPassword: this is not your current password',
    });
    const short = await t.gql(CHANGE, { i: { currentPassword: OLD, newPassword: 'short' } }, here);
    expect(short.data?.changePassword).toMatchObject({ __typename: 'ValidationError', field: 'input.newPassword' });
    expect(await signedIn(elsewhere)).toBe(p.email);

    const changed = await t.gql(CHANGE, { i: { currentPassword: OLD, newPassword: NEW } }, here);
    expect(changed.data?.changePassword).toEqual({ __typename: 'PasswordChanged', signedOut: 1 });
    expect(await signedIn(here)).toBe(p.email);
    expect(await signedIn(elsewhere)).toBeUndefined();
    expect(await within('the other session’s live view to end', watching.ended)).toMatch(/closed|complete|error/);

    await expect(t.login(p.email, OLD)).rejects.toThrow(/wrong email or password/);
    expect(await signedIn(await t.login(p.email, NEW))).toBe(p.email);

    const audit = await t.app.db.prisma.auditEvent.findMany({
      where: { action: 'changePassword' },
      orderBy: { id: 'asc' },
    });
    expect(audit.map((a) => a.outcome)).toEqual(['REFUSED', 'REFUSED', 'DONE']);
    expect(audit.at(-1)?.message).toBe('changed their own password; 1 other session signed out');
  });

  it('is refused to anonymous callers', async () => {
    const r = await t.gql(CHANGE, { i: { currentPassword: ADMIN_PASSWORD, newPassword: NEW } });
    expect(r.data?.changePassword.__typename).toBe('UnauthenticatedError');
  });
});

describe("an admin resetting another user's password", () => {
  it('ends every session of theirs and their live views; the new password signs in', async () => {
    const p = await person();
    const theirs = await t.login(p.email, OLD);
    const watching = live(theirs);
    await within('their session to go live', watching.listening);

    const admin = await t.login();
    const r = await t.gql(
      'mutation($id: ID!, $i: UpdateUserInput!) { updateUser(id: $id, input: $i) { __typename ... on Error { message } } }',
      { id: p.id, i: { password: NEW } },
      admin,
    );
    expect(r.data?.updateUser.__typename).toBe('User');
    expect(await signedIn(theirs)).toBeUndefined();
    expect(await within('their live view to end', watching.ended)).toMatch(/closed|complete|error/);
    expect(await signedIn(admin)).toBeDefined();
    await expect(t.login(p.email, OLD)).rejects.toThrow(/wrong email or password/);
    expect(await signedIn(await t.login(p.email, NEW))).toBe(p.email);
  });
});
