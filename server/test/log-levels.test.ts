import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type App, createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { ADMIN_EMAIL, ADMIN_PASSWORD, freshDatabase } from './harness.js';

// What an operator reading the log at level error should find there: faults, not callers being refused. Every
// refusal below is answered to its caller with the reason; the log says it at info, in one line, with no stack.

type Line = { level: string; msg: string; [k: string]: unknown };
const lines: Line[] = [];
let app: App;
let url: string;
let dataDir: string;

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
});
afterAll(async () => {
  await app.stop();
  await fs.rm(dataDir, { recursive: true, force: true });
});

async function post(query: string, variables: Record<string, unknown> = {}, headers: Record<string, string> = {}) {
  const r = await fetch(`${url}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ query, variables }),
  });
  return (await r.json()) as { data?: any; errors?: { message: string; extensions: { code: string } }[] };
}

/** The lines logged while `what` ran. */
async function logged(what: () => Promise<unknown>): Promise<Line[]> {
  const from = lines.length;
  await what();
  return lines.slice(from);
}

describe('log levels', () => {
  it('logs expected refusals at info, in one line without a stack, and nothing of them at error', async () => {
    const session = await fetch(`${url}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        query: `mutation { login(email: "${ADMIN_EMAIL}", password: "${ADMIN_PASSWORD}") { __typename } }`,
      }),
    });
    const cookie = session.headers
      .getSetCookie()
      .map((c) => c.split(';')[0])
      .join('; ');
    const csrf = (await session.json()) && /hangar_csrf=([^;]+)/.exec(cookie)?.[1];
    const made = await post(
      'mutation { createApiToken(input: { name: "calls-only", role: VIEWER, callerOnly: true }) { ... on CreatedApiToken { secret } } }',
      {},
      { cookie, 'x-hangar-csrf': csrf ?? '' },
    );
    const callerOnly = made.data.createApiToken.secret as string;
    expect(callerOnly).toMatch(/^hgr_/);

    const refusals: [string, () => Promise<unknown>][] = [
      ['an anonymous request', () => post('{ users { id } }')],
      ['an unknown token', () => post('{ users { id } }', {}, { authorization: 'Bearer hgr_not-a-token' })],
      ['a caller-only token on GraphQL', () => post('{ users { id } }', {}, { authorization: `Bearer ${callerOnly}` })],
      ['a session cookie without its CSRF header', () => post('mutation { logout { __typename } }', {}, { cookie })],
      ['a refused sign-in', () => post('mutation { login(email: "x@example.com", password: "wrong") { __typename } }')],
      ['a validation refusal', () => post('mutation { login(email: "not an email", password: "") { __typename } }')],
    ];
    for (const [what, send] of refusals) {
      const got = await logged(send);
      expect([what, got.filter((l) => l.level === 'error' || l.level === 'warn')]).toEqual([what, []]);
      expect([what, JSON.stringify(got)]).not.toContain('stack');
    }
    const anonymous = await logged(() => post('{ users { id } }'));
    expect(anonymous.filter((l) => l.level !== 'debug')).toEqual([
      expect.objectContaining({ level: 'info', msg: 'refused', code: 'UNAUTHENTICATED', reason: expect.any(String) }),
    ]);
  });
});
