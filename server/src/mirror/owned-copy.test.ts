import fs from 'node:fs/promises';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { downloadFile } from '@huggingface/hub';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// The mirror keeps one copy of the same bytes, linking a new file to a verified one with the same sha256. That
// reuse must not cross an owner: a team's trained adapter, whose sha256 any viewer could read, is linked into
// another version only for a requester its owner admits. Anyone else's file is fetched from its URL, like any
// other, and ends as what that URL serves. The attacks run as written in issue 26: an operator of another team
// asks for the digest (or an upstream of theirs claims it in its headers), and a viewer then reads the version.

let t: TestApp;
let up: Upstream;
let hub: FakeHub;
let base: string;
const TEAM_BYTES = bytes(40_000, 26);
const TEAM_SHA = sha256(TEAM_BYTES);
const TEAM_FILE = 'secret-adapter/v1/adapter.gguf';
const who: Record<'member' | 'outsider' | 'viewer' | 'admin', string> = {
  member: '',
  outsider: '',
  viewer: '',
  admin: '',
};

const FETCH = `mutation($m: String!, $v: String!, $s: [MirrorSourceInput!]!) {
  fetchToMirror(model: $m, version: $v, sources: $s, fetchAnyway: true) { __typename ... on Error { message } } }`;

async function fetchAs(token: string, model: string, version: string, sources: Record<string, unknown>[]) {
  const r = await t.gql(FETCH, { m: model, v: version, s: sources }, { token });
  expect(r.data?.fetchToMirror.__typename, JSON.stringify(r)).toBe('FetchStarted');
}

async function settled(model: string, version: string) {
  const end = Date.now() + 20_000;
  for (;;) {
    const rows = await t.app.db.prisma.mirrorFile.findMany({ where: { model, version } });
    if (rows.length && rows.every((r) => ['PRESENT', 'FAILED', 'CANCELLED'].includes(r.state))) return rows;
    if (Date.now() > end) throw new Error(`${model}/${version} did not settle: ${JSON.stringify(rows)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const onDisk = (file: string) => `${t.dataDir}/mirror/files/${file}`;
const links = async () => (await fs.stat(onDisk(TEAM_FILE))).nlink;
const mirrorGet = (file: string, token: string) =>
  fetch(`${base}/mirror/${file}`, { headers: { authorization: `Bearer ${token}` } });

beforeAll(async () => {
  hub = await startFakeHub();
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  base = await t.app.start();
  up = await startUpstream();
  const p = t.app.db.prisma;
  const org = await p.org.create({ data: { name: 'acme' } });
  const secret = await p.team.create({ data: { orgId: org.id, name: 'secret' } });
  const sales = await p.team.create({ data: { orgId: org.id, name: 'sales' } });
  // A key reads what it was made a member of (org-owners.ts), so each token is a member of its own.
  const member = async (role: 'OPERATOR' | 'VIEWER', name: string, teamId: string | null) => {
    const token = await t.token(role, name);
    const row = await p.apiToken.findFirstOrThrow({ where: { name } });
    if (teamId) await p.membership.create({ data: { orgId: org.id, teamId, apiTokenId: row.id } });
    return token;
  };
  who.member = await member('OPERATOR', 'secret-operator', secret.id);
  who.outsider = await member('OPERATOR', 'sales-operator', sales.id);
  who.viewer = await member('VIEWER', 'plain-viewer', null);
  who.admin = await t.token('ADMIN', 'admin');

  // The team's adapter, published as training publishes one: its bytes in the mirror, its row owned by the team.
  const put = await fetch(`${base}/mirror/${TEAM_FILE}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${who.admin}`, 'x-content-sha256': TEAM_SHA },
    body: new Uint8Array(TEAM_BYTES),
  });
  expect(put.status).toBe(201);
  const model = await p.catalogModel.create({
    data: { name: 'tiny', source: `${base}/mirror/tiny/v1/tiny.gguf`, engine: 'llamacpp', minReplicas: 0 },
  });
  await p.adapter.create({
    data: {
      name: 'secret-adapter',
      source: `${base}/mirror/${TEAM_FILE}`,
      owner: `team:${secret.id}`,
      modelId: model.id,
    },
  });
  expect((await mirrorGet(TEAM_FILE, who.viewer)).status).toBe(404);
}, 60_000);
afterAll(async () => {
  await t?.close();
  await up?.close();
  await hub?.close();
});

describe("a team adapter's sha256 asked for by another team", () => {
  it('is not linked: the file is fetched from its URL, and no viewer gets the adapter from /mirror or /hf', async () => {
    // The attacker's allowed URL, shaped like a Hub file, serves bytes of its own.
    const commit = 'a'.repeat(40);
    hub.repos.set('sales/loot', {
      id: 'sales/loot',
      sha: commit,
      files: [{ path: 'adapter.gguf', head: bytes(1000, 99), size: 1000, lfs: true }],
    });
    hub.requests.length = 0;
    await fetchAs(who.outsider, 'loot', 'v1', [
      { url: `${hub.url}/sales/loot/resolve/${commit}/adapter.gguf`, file: 'adapter.gguf', sha256: TEAM_SHA },
    ]);
    const [row] = await settled('loot', 'v1');
    expect(row?.state).toBe('FAILED');
    expect(row?.error).toMatch(/^sha256 mismatch/);
    // Fetched, not linked: the upstream was asked, and the team's file has no second link.
    expect(hub.requests.some((r) => r.method === 'GET' && r.path.includes('/sales/loot/resolve/'))).toBe(true);
    expect(await links()).toBe(1);
    const viaMirror = await mirrorGet('loot/v1/adapter.gguf', who.viewer);
    expect(viaMirror.status).toBe(404);
    const viaHf = await downloadFile({
      repo: 'sales/loot',
      path: 'adapter.gguf',
      hubUrl: `${base}/hf`,
      accessToken: `hf_${who.viewer}`,
    }).then(
      (blob) => blob,
      () => null,
    );
    expect(viaHf).toBeNull();
  }, 30_000);

  it('is not linked when the upstream only claims that digest in its headers: its own bytes are downloaded', async () => {
    // X-Linked-Etag and ETag say the team's sha256; the body is other bytes.
    up.files.set('claims.gguf', { body: TEAM_BYTES, fault: { kind: 'wrong-bytes' } });
    await fetchAs(who.outsider, 'loot', 'v2', [{ url: up.url('claims.gguf') }]);
    const [row] = await settled('loot', 'v2');
    expect(row?.state).toBe('FAILED');
    expect(row?.error).toMatch(/^sha256 mismatch: the upstream published/);
    expect(up.requests.filter((r) => r.name === 'claims.gguf' && r.status < 300).length).toBeGreaterThan(0);
    expect(await links()).toBe(1);
    expect((await mirrorGet('loot/v2/claims.gguf', who.viewer)).status).toBe(404);
  }, 30_000);

  it('links it for a member of the team: asked for by its sha256, nothing is fetched', async () => {
    up.requests.length = 0;
    await fetchAs(who.member, 'team-copy', 'v1', [{ url: up.url('nowhere.gguf'), sha256: TEAM_SHA }]);
    const [row] = await settled('team-copy', 'v1');
    expect(row).toMatchObject({ state: 'PRESENT', actualSha256: TEAM_SHA });
    expect(up.requests.filter((r) => r.name === 'nowhere.gguf')).toHaveLength(0);
    expect((await fs.stat(onDisk('team-copy/v1/nowhere.gguf'))).ino).toBe((await fs.stat(onDisk(TEAM_FILE))).ino);
  }, 30_000);
});
