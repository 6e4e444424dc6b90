import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db/database.js';
import { installGpuTime } from '../src/fleet/gpu-time.js';
import { freshDatabase, startTestApp, type TestApp } from './harness.js';

// The cost of calls (#28): a replica's GPU time, recorded by the database as the replica's state changes
// (fleet/gpu-time.ts), priced per GPU-hour and divided among the requests it served by their tokens; idle time
// apart. Usage rows are written directly, as the gateway's recorder leaves them (gateway/usage.test.ts does the
// same): what is under test is the lifetime recorded, the prices, and the arithmetic, to the cent.

let t: TestApp;
let admin: string;
let yamlDir: string;
let base: string;
const MIN = 60_000;
const BIN = path.resolve(import.meta.dirname, '..', 'bin', 'hangar.mjs');

type Line = {
  scope: string | null;
  scopeLabel: string | null;
  team: string | null;
  model: string | null;
  node: string | null;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  cost: string;
  idleCost: string;
  totalCost: string;
  perMillionTokens: string | null;
};
const TOTALS = 'requests promptTokens completionTokens cost idleCost totalCost perMillionTokens';
const LINE = `idle scope scopeLabel team model node ${TOTALS}`;

async function report(vars: Record<string, unknown>, token = admin) {
  const r = await t.gql(
    `query($from: DateTime!, $to: DateTime!, $by: [CostDimension!], $scope: String, $model: String, $step: Int) {
      costReport(from: $from, to: $to, by: $by, scope: $scope, model: $model, step: $step) {
        __typename
        ... on CostReport { currency unpricedGpuHours total { ${TOTALS} } lines { ${LINE} } points { at cost idleCost } }
        ... on Error { message }
      }
    }`,
    vars,
    { token },
  );
  return r;
}

/** A caller with an API token: its user id and token id. */
async function caller(email: string) {
  const session = await t.login();
  const created = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { ... on User { id } ... on Error { message } } }',
    { i: { email, name: email, role: 'VIEWER', password: 'a-long-enough-password' } },
    session,
  );
  const userId = created.data?.createUser.id as string;
  const own = await t.login(email, 'a-long-enough-password');
  const token = await t.gql(
    'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { ... on CreatedApiToken { secret token { id } } } }',
    { i: { name: `${email}-script`, role: 'VIEWER' } },
    own,
  );
  return { userId, tokenId: token.data?.createApiToken.token.id as string };
}

beforeAll(async () => {
  yamlDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cost-'));
  const yaml = path.join(yamlDir, 'hangar.yaml');
  await fs.writeFile(yaml, 'prices:\n  - gpu: NVIDIA L4\n    perGpuHour: 0.80\n');
  t = await startTestApp({ HANGAR_CONFIG: yaml, HANGAR_CURRENCY: 'EUR', HOST: '127.0.0.1' });
  admin = await t.token('ADMIN', 'cost-admin');
  base = await t.app.start();
});

afterAll(async () => {
  await t?.close();
  await fs.rm(yamlDir, { recursive: true, force: true });
});

describe('prices', () => {
  it('are set by an admin, audited, read back, and refused to an operator', async () => {
    const set = await t.gql(
      'mutation { setNodePrice(node: "gpu-1", perGpuHour: "2.37") { __typename ... on Price { name perGpuHour currency } ... on Error { message } } }',
      {},
      { token: admin },
    );
    expect(set.data?.setNodePrice).toEqual({ __typename: 'Price', name: 'gpu-1', perGpuHour: '2.37', currency: 'EUR' });
    const audit = await t.app.db.prisma.auditEvent.findFirst({ where: { action: 'setNodePrice' } });
    expect(audit?.target).toBe('node gpu-1');
    expect(audit?.message).toBe('perGpuHour 2.37');

    const operator = await t.token('OPERATOR', 'cost-operator');
    const refused = await t.gql(
      'mutation { setNodePrice(node: "gpu-1", perGpuHour: "0.01") { __typename } }',
      {},
      { token: operator },
    );
    expect(refused.data?.setNodePrice.__typename).toBe('ForbiddenError');
    const read = await t.gql('{ prices { target name perGpuHour declared } }', {}, { token: operator });
    expect(read.data?.prices).toEqual([
      { target: 'NODE', name: 'gpu-1', perGpuHour: '2.37', declared: false },
      { target: 'GPU', name: 'NVIDIA L4', perGpuHour: '0.80', declared: true },
    ]);
  });

  it('refuses a price that is not a decimal, naming the field, and a declared one', async () => {
    const bad = await t.gql(
      'mutation { setNodePrice(node: "gpu-1", perGpuHour: "2,37") { __typename ... on Error { message } } }',
      {},
      { token: admin },
    );
    expect(bad.data?.setNodePrice.__typename).toBe('ValidationError');
    expect(bad.data?.setNodePrice.message).toMatch(/^perGpuHour: a price is a non-negative decimal/);
    const declared = await t.gql(
      'mutation { setGpuPrice(gpu: "NVIDIA L4", perGpuHour: "9") { __typename ... on Error { message } } }',
      {},
      { token: admin },
    );
    expect(declared.data?.setGpuPrice.__typename).toBe('ConflictError');
    expect(declared.data?.setGpuPrice.message).toMatch(/declared in hangar\.yaml/);
  });
});

describe('costReport', () => {
  // A fixed past: the replica's lifetime is known to the second.
  const T0 = new Date(Math.floor(Date.now() / MIN) * MIN - 6 * 60 * MIN);
  const at = (minutes: number) => new Date(T0.getTime() + minutes * MIN);
  let a: { userId: string; tokenId: string };
  let b: { userId: string; tokenId: string };
  let replicaId: string;

  beforeAll(async () => {
    const db = t.app.db.prisma;
    a = await caller('ana@example.com');
    b = await caller('ben@example.com');
    const session = await t.login();
    await t.gql('mutation { createOrg(name: "acme") { __typename } }', {}, session);
    await t.gql('mutation { createTeam(org: "acme", name: "ml") { __typename } }', {}, session);
    const member = await t.gql(
      'mutation($i: AddMemberInput!) { addMember(input: $i) { __typename ... on Error { message } } }',
      { i: { org: 'acme', team: 'ml', apiToken: a.tokenId } },
      session,
    );
    expect(member.data?.addMember.__typename).toBe('Membership');

    const node = await db.node.create({
      data: {
        name: 'gpu-1',
        tokenHash: 'cost-test-node',
        gpus: [
          { index: 0, name: 'NVIDIA L4', totalMiB: 23_034, freeMiB: 23_034 },
          { index: 1, name: 'NVIDIA L4', totalMiB: 23_034, freeMiB: 23_034 },
        ],
      },
    });
    const model = await db.catalogModel.create({
      data: { name: 'llama-8b', source: 'http://127.0.0.1/m.gguf', engine: 'llamacpp' },
    });
    // The replica's life as the fleet writes it: placed, loading, ready, stopped. Spread over both GPUs.
    const replica = await db.replica.create({ data: { modelId: model.id, nodeId: node.id, state: 'PENDING' } });
    replicaId = replica.id;
    await db.replica.update({ where: { id: replica.id }, data: { state: 'LOADING' } });
    await db.replica.update({ where: { id: replica.id }, data: { state: 'READY', endpoint: 'http://x/v1' } });
    await db.replica.update({ where: { id: replica.id }, data: { message: 'still ready' } });
    await db.replica.update({ where: { id: replica.id }, data: { state: 'STOPPED' } });
    const spans = await db.gpuTime.findMany({ where: { replicaId } });
    expect(spans).toHaveLength(1);
    expect(spans[0]).toMatchObject({ node: 'gpu-1', gpuName: 'NVIDIA L4' });
    expect(Number(spans[0]?.gpus)).toBe(2);
    expect(spans[0]?.endedAt).not.toBeNull();
    // Its lifetime, moved to a known past: from T0 for 97 minutes 30 seconds.
    await db.$executeRaw`UPDATE "GpuTime" SET "startedAt" = ${T0}, "endedAt" = ${new Date(T0.getTime() + 97.5 * MIN)}
      WHERE "replicaId" = ${replicaId}::uuid`;

    const row = (
      minute: Date,
      who: { userId: string; tokenId: string },
      promptTokens: number,
      completionTokens: number,
    ) => ({
      minute,
      tokenId: who.tokenId,
      userId: who.userId,
      model: 'llama-8b',
      node: 'gpu-1',
      replicaId,
      requests: 1,
      promptTokens,
      completionTokens,
    });
    await db.usageMinute.createMany({
      data: [
        // Minute 10: ana 300 tokens, ben 100: ana pays three quarters of the minute, ben one.
        row(at(10), a, 200, 100),
        row(at(10), b, 60, 40),
        // Minute 20: ana alone.
        row(at(20), a, 30, 20),
      ],
    });
  });

  it('matches a known GPU-hour price and a known replica lifetime to the cent, idle apart', async () => {
    // 2 GPUs × 2.37 per GPU-hour (the node's price wins over its GPU model's 0.80) × 1.625 h = 7.7025.
    // A minute costs 4.74 / 60 = 0.079. Ana: 0.75 × 0.079 + 0.079 = 0.13825; Ben: 0.01975; idle: the rest.
    const r = await report({ from: at(-60), to: at(180), by: ['SCOPE'] });
    expect(r.data?.costReport.__typename).toBe('CostReport');
    const cr = r.data?.costReport;
    expect(cr.currency).toBe('EUR');
    expect(cr.total).toMatchObject({ cost: '0.16', idleCost: '7.54', totalCost: '7.70', requests: 3 });
    const byScope = Object.fromEntries(cr.lines.map((l: Line) => [l.scope ?? 'idle', l]));
    expect(byScope[`key:${a.tokenId}`]).toMatchObject({ cost: '0.14', idleCost: '0.00', promptTokens: 230 });
    expect(byScope[`key:${a.tokenId}`].scopeLabel).toBe('key:ana@example.com-script (ana@example.com)');
    expect(byScope[`key:${b.tokenId}`]).toMatchObject({ cost: '0.02', idleCost: '0.00' });
    expect(byScope.idle).toMatchObject({ cost: '0.00', idleCost: '7.54', requests: 0 });
    expect(cr.unpricedGpuHours).toBe(0);
    // The chart: hourly points from T0 - 1 h; the replica ran in the second and third.
    expect(cr.points).toHaveLength(4);
    expect(cr.points.map((p: { cost: string }) => p.cost)).toEqual(['0.00', '0.16', '0.00', '0.00']);
    // 60 minutes of the first hour, less the two busy minutes (0.158): 4.74 − 0.158 = 4.582; then 37.5 minutes.
    expect(cr.points.map((p: { idleCost: string }) => p.idleCost)).toEqual(['0.00', '4.58', '2.96', '0.00']);
  });

  it("answers what a team's calls to a model cost, and what a million tokens of it cost", async () => {
    const team = await report({ from: at(-60), to: at(180), by: ['MODEL'], scope: 'team:acme/ml' });
    const lines = team.data?.costReport.lines as Line[];
    // Only ana's token is in acme/ml; idle time is nobody's calls and is left out.
    expect(lines).toEqual([expect.objectContaining({ model: 'llama-8b', cost: '0.14', idleCost: '0.00' })]);

    const fleet = await report({ from: at(-60), to: at(180), by: ['MODEL'] });
    const [model] = (fleet.data?.costReport.lines ?? []) as Line[];
    // 7.7025 over 450 tokens, per million.
    expect(model).toMatchObject({ model: 'llama-8b', totalCost: '7.70', perMillionTokens: '17116.6667' });

    const byTeam = await report({ from: at(-60), to: at(180), by: ['TEAM'] });
    const teamLines = (byTeam.data?.costReport.lines ?? []) as (Line & { idle: boolean })[];
    const teams = Object.fromEntries(teamLines.map((l) => [l.idle ? 'idle' : (l.team ?? '-'), l]));
    expect(teams['team:acme/ml']).toMatchObject({ cost: '0.14' });
    // Ben is in no team; idle time is a line of its own, not a team's.
    expect(teams['-']).toMatchObject({ cost: '0.02', idleCost: '0.00' });
    expect(teams.idle).toMatchObject({ cost: '0.00', idleCost: '7.54' });
  });

  it('prices a model with a fixed price per million tokens by its tokens instead of its GPU time', async () => {
    const set = await t.gql(
      'mutation { setModelPrice(model: "llama-8b", perMillionPromptTokens: "1000", perMillionCompletionTokens: "3000") { __typename } }',
      {},
      { token: admin },
    );
    expect(set.data?.setModelPrice.__typename).toBe('Price');
    try {
      const r = await report({ from: at(-60), to: at(180) });
      // Ana 230 prompt + 120 completion, ben 60 + 40: 290 × 0.001 + 160 × 0.003 = 0.77; no GPU time priced.
      expect(r.data?.costReport.total).toMatchObject({ cost: '0.77', idleCost: '0.00' });
      // The price table a spend budget reads (pricing.ts) has it after the event.
      await expect
        .poll(() => t.app.services.cost.pricing.perMillionTokens('llama-8b'))
        .toEqual({ prompt: 1000, completion: 3000 });
      // And /metrics says so, by model and kind, in the site currency.
      const scraped = await (await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${admin}` } })).text();
      expect(scraped).toContain('hangar_cost_per_million_tokens{model="llama-8b",kind="prompt",currency="EUR"} 1000');
      expect(scraped).toContain(
        'hangar_cost_per_million_tokens{model="llama-8b",kind="completion",currency="EUR"} 3000',
      );
    } finally {
      await t.gql(
        'mutation { setModelPrice(model: "llama-8b", perMillionPromptTokens: null, perMillionCompletionTokens: null) { __typename } }',
        {},
        { token: admin },
      );
    }
  });

  it('gives usage(...) the cost of the calls it counts', async () => {
    const r = await t.gql(
      'query($from: DateTime!, $to: DateTime!) { usage(from: $from, to: $to, step: 60) { ... on Usage { cost totals { requests } } } }',
      { from: at(0).toISOString(), to: at(120).toISOString() },
      { token: admin },
    );
    expect(r.data?.usage).toEqual({ cost: '0.16', totals: { requests: 3 } });
  });

  it('is what `hangar usage --by team --from DAY` prints, with cost', async () => {
    const { HANGAR_URL: _u, HANGAR_TOKEN: _t, XDG_CONFIG_HOME: _x, ...inherited } = process.env;
    const proc = spawn(
      process.execPath,
      [BIN, 'usage', '--by', 'team', '--from', at(-60).toISOString().slice(0, 10), '--to', at(180).toISOString()],
      { cwd: yamlDir, env: { ...inherited, HOME: yamlDir, HANGAR_URL: base, HANGAR_TOKEN: admin } },
    );
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (d) => {
      stdout += String(d);
    });
    proc.stderr.on('data', (d) => {
      stderr += String(d);
    });
    const code = await new Promise((resolve) => proc.once('exit', resolve));
    expect(stderr).toBe('');
    expect(code).toBe(0);
    const rows = stdout.split('\n').map((l) => l.trim().split(/\s{2,}/));
    expect(rows[1]).toEqual(['TEAM', 'REQUESTS', 'TOKENS', 'COST', 'IDLE', 'PER 1M TOKENS']);
    expect(rows).toContainEqual(['team:acme/ml', '2', '350', '0.14', '0.00', '395.0000']);
    expect(rows).toContainEqual(['(no team)', '1', '100', '0.02', '0.00', '197.5000']);
    expect(rows).toContainEqual(['(idle)', '0', '0', '0.00', '7.54', '-']);
    expect(rows).toContainEqual(['TOTAL', '3', '450', '0.16', '7.54', '17116.6667']);
    expect(stdout).toContain('in EUR');
  });

  it('is for admins only', async () => {
    const operator = await t.token('OPERATOR', 'cost-reader');
    const r = await report({ from: at(-60), to: at(180) }, operator);
    expect(r.data?.costReport).toMatchObject({ __typename: 'ForbiddenError' });
  });
});

describe('GPU time of a card several replicas share', () => {
  // The database's trigger alone (fleet/gpu-time.ts), on a database of its own: a server's placement pass, which
  // now runs at every replica's event, would stop these hand-placed replicas under the test.
  let fresh: Database;
  beforeAll(async () => {
    fresh = await freshDatabase();
    await installGpuTime(fresh.prisma);
  });
  afterAll(async () => {
    await fresh?.close();
  });

  it('divides each card among the replicas holding it, so a card is paid once, and follows them as they come and go', async () => {
    const db = fresh.prisma;
    const node = await db.node.create({
      data: {
        name: 'gpu-shared',
        tokenHash: 'cost-test-shared-node',
        gpus: [
          { index: 0, name: 'NVIDIA L4', totalMiB: 23_034, freeMiB: 23_034 },
          { index: 1, name: 'NVIDIA L4', totalMiB: 23_034, freeMiB: 23_034 },
        ],
      },
    });
    const model = await db.catalogModel.create({
      data: { name: 'small-shared', source: 'http://127.0.0.1/s.gguf', engine: 'llamacpp' },
    });
    const place = (data: { gpuIndex?: number; gpuIndexes?: number[] }) =>
      db.replica.create({ data: { modelId: model.id, nodeId: node.id, state: 'LOADING', ...data } });
    /** Each replica's open share, and the sum of every share on the node: its two cards' worth when any is held. */
    const open = async () => {
      const spans = await db.gpuTime.findMany({ where: { node: 'gpu-shared', endedAt: null } });
      return Object.fromEntries(spans.map((s) => [s.replicaId, Number(s.gpus)]));
    };

    const x = await place({ gpuIndex: 0 });
    expect(await open()).toEqual({ [x.id]: 1 });
    const y = await place({ gpuIndex: 0 });
    expect(await open()).toEqual({ [x.id]: 0.5, [y.id]: 0.5 });
    // A model split over both cards: a third of card 0 and all of card 1.
    const z = await place({ gpuIndexes: [0, 1] });
    expect(await open()).toEqual({ [x.id]: 0.333333, [y.id]: 0.333333, [z.id]: 1.333333 });
    await db.replica.update({ where: { id: y.id }, data: { state: 'READY' } });
    expect(await open()).toEqual({ [x.id]: 0.333333, [y.id]: 0.333333, [z.id]: 1.333333 });
    await db.replica.update({ where: { id: y.id }, data: { state: 'STOPPED' } });
    expect(await open()).toEqual({ [x.id]: 0.5, [z.id]: 1.5 });
    await db.replica.delete({ where: { id: x.id } });
    expect(await open()).toEqual({ [z.id]: 2 });
    // Each replica's spans follow one another without a gap or an overlap.
    const zSpans = await db.gpuTime.findMany({ where: { replicaId: z.id }, orderBy: { startedAt: 'asc' } });
    expect(zSpans.map((s) => Number(s.gpus))).toEqual([1.333333, 1.5, 2]);
    for (let i = 1; i < zSpans.length; i++) expect(zSpans[i]?.startedAt).toEqual(zSpans[i - 1]?.endedAt);
    // The node removed: its replicas hold nothing any more, and no span stays open.
    await db.node.delete({ where: { id: node.id } });
    expect(await open()).toEqual({});
    await db.catalogModel.delete({ where: { id: model.id } });
  });
});
