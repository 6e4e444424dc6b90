import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// The audit log an operator searches: by who, what, on what, how it ended and when. Each filter narrows the same
// newest-first pages, and paging on keeps the filter.

let t: TestApp;
let admin: string;
beforeAll(async () => {
  t = await startTestApp();
  admin = await t.token('ADMIN', 'audit-admin');
  for (const name of ['gpu-a', 'gpu-b', 'gpu-c'])
    await t.gql(`mutation { createNode(name: "${name}") { __typename } }`, {}, { token: admin });
  // A refusal to find: a second node of the same name.
  await t.gql('mutation { createNode(name: "gpu-a") { __typename } }', {}, { token: admin });
});
afterAll(() => t.close());

const EVENTS = `query($first: Int, $after: String, $filter: AuditFilter) {
  auditEvents(first: $first, after: $after, filter: $filter) {
    edges { node { actor action target outcome at } }
    pageInfo { hasNextPage endCursor }
  }
}`;

type Row = { actor: string; action: string; target: string | null; outcome: string; at: string };
async function events(filter: Record<string, unknown>, first = 50, after?: string) {
  const r = await t.gql(EVENTS, { first, after, filter }, { token: admin });
  if (r.errors) return { errors: r.errors };
  const c = r.data?.auditEvents;
  return { rows: c.edges.map((e: { node: Row }) => e.node) as Row[], pageInfo: c.pageInfo };
}

describe('auditEvents filters', () => {
  it('narrows by action, target, actor and outcome, together', async () => {
    const created = await events({ action: 'createnode' });
    expect(created.rows?.map((r) => `${r.target} ${r.outcome}`)).toEqual([
      'gpu-a REFUSED',
      'gpu-c DONE',
      'gpu-b DONE',
      'gpu-a DONE',
    ]);
    expect((await events({ action: 'createNode', outcome: 'REFUSED' })).rows?.map((r) => r.target)).toEqual(['gpu-a']);
    expect((await events({ target: 'GPU-B' })).rows?.map((r) => r.action)).toEqual(['createNode']);
    const byToken = await events({ actor: 'token:audit-admin' });
    expect(byToken.rows?.length).toBe(4);
    expect(new Set(byToken.rows?.map((r) => r.actor))).toEqual(new Set(['token:audit-admin (admin@example.com)']));
    expect((await events({ actor: 'node:' })).rows).toEqual([]);
  });

  it('narrows by time, and keeps the filter from page to page', async () => {
    const all = (await events({ action: 'createNode' })).rows ?? [];
    const oldest = all.at(-1)?.at as string;
    const later = await events({ action: 'createNode', from: new Date(Date.parse(oldest) + 1).toISOString() });
    expect(later.rows?.length).toBe(all.filter((r) => r.at > oldest).length);
    const before = await events({ action: 'createNode', to: new Date(Date.parse(oldest) + 1).toISOString() });
    expect(before.rows?.map((r) => r.at)).toEqual(all.filter((r) => r.at <= oldest).map((r) => r.at));

    const first = await events({ action: 'createNode' }, 3);
    expect(first.pageInfo.hasNextPage).toBe(true);
    const second = await events({ action: 'createNode' }, 3, first.pageInfo.endCursor);
    expect(second.rows?.map((r) => `${r.target} ${r.outcome}`)).toEqual(['gpu-a DONE']);
    expect(second.pageInfo.hasNextPage).toBe(false);
  });

  it('refuses a time range that ends before it starts, naming the field', async () => {
    const r = await events({ from: '2026-12-02T00:00:00Z', to: '2026-12-01T00:00:00Z' });
    expect(r.errors?.[0]).toMatchObject({
      message: expect.stringMatching(/^filter\.to: 2026-12-01T00:00:00\.000Z is not after filter\.from/),
      extensions: { code: 'VALIDATION' },
    });
  });
});
