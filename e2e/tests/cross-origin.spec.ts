import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect, test } from '@playwright/test';
import { adminApi, signIn, snap } from '../fixtures/hangar.js';
import { baseURL } from '../playwright.config.js';

// A hostile page on another port of the same host, opened by an admin who is signed in to the console. Cookies
// are not kept apart by port, so the browser sends Hangar's session cookie with whatever that page asks for;
// only CORS stands between that page and the admin's powers. The page is served by a tiny server here.

const attackerPage = `<!doctype html><title>Totally harmless</title>
<h1>Nothing to see</h1>
<iframe id="framed" src="${baseURL}/" width="400" height="300"></iframe>`;

let attacker: http.Server;
let attackerUrl: string;
test.beforeAll(async () => {
  attacker = http.createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(attackerPage);
  });
  await new Promise<void>((r) => attacker.listen(0, '127.0.0.1', r));
  attackerUrl = `http://127.0.0.1:${(attacker.address() as AddressInfo).port}/`;
});
test.afterAll(() => new Promise<void>((r) => attacker.close(() => r())));

test('a page on another port cannot read users or tokens, use the CSRF token, or make an ADMIN token', async ({
  page,
  request,
}) => {
  await signIn(page);
  await expect(page.getByRole('navigation').getByRole('link', { name: 'Tokens' })).toBeVisible();

  await page.goto(attackerUrl);
  await expect(page.getByRole('heading', { name: 'Nothing to see' })).toBeVisible();
  const tried = await page.evaluate(async (hangar) => {
    const gql = `${hangar}/graphql`;
    const attempt = async (what: () => Promise<Response>) => {
      try {
        const r = await what();
        return { read: await r.text() };
      } catch (err) {
        return { refused: String(err) };
      }
    };
    const csrf = document.cookie.match(/(?:^|; )hangar_csrf=([^;]*)/)?.[1] ?? '';
    const steal =
      'mutation { createApiToken(input: { name: "stolen", role: ADMIN }) { __typename ... on CreatedApiToken { secret } } }';
    return {
      users: await attempt(() =>
        fetch(gql, {
          method: 'POST',
          credentials: 'include',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ query: '{ users { email } apiTokens(all: true) { name } }' }),
        }),
      ),
      // A simple request (no preflight): it is sent, but its answer is not the page's to read.
      usersSimple: await attempt(() =>
        fetch(gql, {
          method: 'POST',
          credentials: 'include',
          headers: { 'content-type': 'text/plain' },
          body: JSON.stringify({ query: '{ users { email } }' }),
        }),
      ),
      usersGet: await attempt(() =>
        fetch(`${gql}?query=${encodeURIComponent('{ users { email } }')}`, { credentials: 'include' }),
      ),
      tokenWithCsrf: await attempt(() =>
        fetch(gql, {
          method: 'POST',
          credentials: 'include',
          headers: { 'content-type': 'application/json', 'x-hangar-csrf': decodeURIComponent(csrf) },
          body: JSON.stringify({ query: steal }),
        }),
      ),
      // Blind: sent without reading the answer, and without the CSRF header a simple request cannot carry.
      tokenBlind: await attempt(() =>
        fetch(gql, {
          method: 'POST',
          mode: 'no-cors',
          credentials: 'include',
          headers: { 'content-type': 'text/plain' },
          body: JSON.stringify({ query: steal }),
        }),
      ),
    };
  }, baseURL);

  // Nothing came back to the page: every read was refused by the browser for want of a CORS grant.
  // The CSRF cookie is readable here (a cookie is not kept apart by port), but a header carrying it needs a
  // preflight, which gets no grant: knowing the token is not enough to use it.
  expect(tried.users).toEqual({ refused: expect.stringMatching(/TypeError/) });
  expect(tried.usersSimple).toEqual({ refused: expect.stringMatching(/TypeError/) });
  expect(tried.usersGet).toEqual({ refused: expect.stringMatching(/TypeError/) });
  expect(tried.tokenWithCsrf).toEqual({ refused: expect.stringMatching(/TypeError/) });
  expect(tried.tokenBlind).toEqual({ read: '' });
  expect(JSON.stringify(tried)).not.toContain('admin@example.com');
  expect(JSON.stringify(tried)).not.toContain('hgr_');

  // The console refuses to be framed by it.
  const framed = page.frames().find((f) => f !== page.mainFrame());
  expect(framed).toBeTruthy();
  await expect.poll(async () => (await framed?.title().catch(() => '')) ?? '').not.toBe('Hangar');
  expect(await page.frameLocator('#framed').getByRole('button', { name: 'Sign in' }).count()).toBe(0);
  await snap(page, 'cross-origin-01-attacker');

  // The admin's own session: no token was made.
  const { gql } = await adminApi(request);
  const tokens = (await gql('{ apiTokens(all: true) { name role } }')).data.apiTokens as { name: string }[];
  expect(tokens.map((t) => t.name)).not.toContain('stolen');
  // Other specs make tokens of their own on this server: the one that must not be there is the attack's.
  const audit = (
    await gql(
      '{ auditEvents(first: 50, filter: { action: "createApiToken", target: "stolen" }) { edges { node { action outcome target } } } }',
    )
  ).data.auditEvents.edges as { node: { action: string; outcome: string; target: string } }[];
  expect(audit.filter((e) => e.node.target === 'stolen' && e.node.outcome === 'DONE')).toHaveLength(0);
});

test('the console and GraphiQL work under their Content-Security-Policy', async ({ page }) => {
  const violations: string[] = [];
  page.on('console', (m) => {
    if (/Content Security Policy|Refused to (load|execute|apply|connect|frame)/i.test(m.text()))
      violations.push(m.text());
  });
  await signIn(page);
  const nav = page.getByRole('navigation');
  for (const name of ['Mirror', 'Registry', 'Models', 'Nodes', 'Training', 'Audit', 'Tokens', 'Users']) {
    await nav.getByRole('link', { name }).click();
    await expect(page).toHaveURL(new RegExp(`/${name.toLowerCase()}`));
  }
  // The audit page's live rows come over the WebSocket, which connect-src 'self' must allow.
  await nav.getByRole('link', { name: 'Audit' }).click();
  await expect(page.getByText('Live: new events appear at the top.')).toBeVisible();
  // GraphiQL reads the schema with the session cookie over GET (introspection is closed to anonymous callers).
  const introspected = page.waitForResponse((r) => r.url().includes('/graphql?') && r.url().includes('__schema'));
  await page.goto('/graphql');
  await expect(page.locator('.graphiql-container').first()).toBeVisible({ timeout: 20_000 });
  const schema = await (await introspected).json();
  expect(schema.errors).toBeUndefined();
  expect(schema.data.__schema.queryType.name).toBe('Query');
  await snap(page, 'cross-origin-02-graphiql');
  expect(violations).toEqual([]);
});
