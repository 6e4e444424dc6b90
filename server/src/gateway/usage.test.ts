import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import type { Prisma } from '../generated/prisma/client.js';
import { USAGE_BUCKETS_MS } from './usage.js';

// Usage rows are written here directly, as the gateway's recorder would leave them: these tests are about reading
// them back (sums per step, zero steps, percentiles, who may read what), not about recording.

let t: TestApp;
let operator: string;
let alice: { secret: string; tokenId: string; userId: string };
let bob: { secret: string; tokenId: string; userId: string };
const T0 = new Date('2026-11-30T10:00:00Z');
const at = (minutes: number) => new Date(T0.getTime() + minutes * 60_000);

/** A histogram with `n` requests in the bucket whose upper bound is `ms`. */
function buckets(counts: Record<number, number>): number[] {
  return USAGE_BUCKETS_MS.map((bound) => counts[bound] ?? 0);
}

async function viewerWithToken(email: string) {
  const admin = await t.login();
  const created = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on User { id } ... on Error { message } } }',
    { i: { email, name: email, role: 'VIEWER', password: 'a-long-enough-password' } },
    admin,
  );
  const userId = created.data?.createUser.id as string;
  const session = await t.login(email, 'a-long-enough-password');
  const token = await t.gql(
    'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { ... on CreatedApiToken { secret token { id } } ... on Error { message } } }',
    { i: { name: `${email}-script`, role: 'VIEWER' } },
    session,
  );
  return {
    secret: token.data?.createApiToken.secret as string,
    tokenId: token.data?.createApiToken.token.id as string,
    userId,
  };
}

beforeAll(async () => {
  t = await startTestApp();
  operator = await t.token('OPERATOR', 'usage-ops');
  alice = await viewerWithToken('alice@example.com');
  bob = await viewerWithToken('bob@example.com');
  const row = (r: Omit<Prisma.UsageMinuteCreateManyInput, 'model'> & { model?: string }) => ({
    model: 'llama-7b',
    ...r,
  });
  await t.app.db.prisma.usageMinute.createMany({
    data: [
      // Minute 0: alice's token on the base model and bob's on an adapter, on two replicas.
      row({
        minute: at(0),
        tokenId: alice.tokenId,
        userId: alice.userId,
        replicaId: 'r1',
        requests: 3,
        errors: 1,
        promptTokens: 300n,
        completionTokens: 600n,
        ttftMsSum: 300,
        ttftCount: 3,
        durationBuckets: buckets({ 100: 2, 1000: 1 }),
      }),
      row({
        minute: at(0),
        tokenId: bob.tokenId,
        userId: bob.userId,
        adapter: 'sql-helper',
        replicaId: 'r2',
        requests: 1,
        aborted: 1,
        promptTokens: 10n,
        completionTokens: 20n,
        ttftMsSum: 500,
        ttftCount: 1,
        durationBuckets: buckets({ 5000: 1 }),
      }),
      // Minute 1: alice again; minute 3: a console session of bob's (no token) past 2^31 prompt tokens.
      row({
        minute: at(1),
        tokenId: alice.tokenId,
        userId: alice.userId,
        requests: 2,
        promptTokens: 100n,
        completionTokens: 120n,
        durationBuckets: buckets({ 50: 1, [Number.POSITIVE_INFINITY]: 1 }),
      }),
      row({
        minute: at(3),
        tokenId: '',
        userId: bob.userId,
        requests: 1,
        promptTokens: 3_000_000_000n,
        completionTokens: 60n,
        ttftMsSum: 40,
        ttftCount: 1,
        durationBuckets: buckets({ 250: 1 }),
      }),
      // Another model, and a minute outside every range asked for below.
      row({ minute: at(0), model: 'other', requests: 7, durationBuckets: buckets({ 50: 7 }) }),
      row({ minute: at(-5), requests: 100, durationBuckets: buckets({ 50: 100 }) }),
    ],
  });
});
afterAll(() => t.close());

const USAGE = `query($model: String, $adapter: String, $token: ID, $from: DateTime!, $to: DateTime!, $step: Int) {
  usage(model: $model, adapter: $adapter, token: $token, from: $from, to: $to, step: $step) {
    __typename
    ... on Usage {
      from to step
      points { at requests errors aborted promptTokens completionTokens tokensPerSecond p50Ms p95Ms meanTtftMs }
      totals { requests errors aborted promptTokens completionTokens tokensPerSecond p50Ms p95Ms meanTtftMs }
    }
    ... on Error { message }
    ... on ValidationError { field }
  }
}`;

const zero = {
  requests: 0,
  errors: 0,
  aborted: 0,
  promptTokens: 0,
  completionTokens: 0,
  tokensPerSecond: 0,
  p50Ms: null,
  p95Ms: null,
  meanTtftMs: null,
};

async function usage(vars: Record<string, unknown>, token = operator) {
  const r = await t.gql(USAGE, vars, { token });
  expect(r.errors).toBeUndefined();
  return r.data?.usage;
}

describe('usage', () => {
  it('sums a model per minute, every minute present, zeros where nothing was recorded', async () => {
    const u = await usage({ model: 'llama-7b', from: at(0).toISOString(), to: at(5).toISOString() });
    expect(u).toMatchObject({ __typename: 'Usage', from: at(0).toISOString(), to: at(5).toISOString(), step: 1 });
    expect(u.points.map((p: { at: string }) => p.at)).toEqual([0, 1, 2, 3, 4].map((m) => at(m).toISOString()));
    // Minute 0: both tokens, both replicas; p50 from 2×≤100, 1×≤1000, 1×≤5000 ms: the second of four is ≤100.
    expect(u.points[0]).toEqual({
      at: at(0).toISOString(),
      requests: 4,
      errors: 1,
      aborted: 1,
      promptTokens: 310,
      completionTokens: 620,
      tokensPerSecond: 620 / 60,
      p50Ms: 100,
      p95Ms: 5000,
      meanTtftMs: 200,
    });
    // One of two past the last finite bound: p95 reads as 120 s, "that long or longer"; no first token: null.
    expect(u.points[1]).toMatchObject({ requests: 2, p50Ms: 50, p95Ms: 120_000, meanTtftMs: null });
    expect(u.points[2]).toEqual({ at: at(2).toISOString(), ...zero });
    expect(u.points[3]).toMatchObject({ requests: 1, promptTokens: 3_000_000_000, p50Ms: 250, p95Ms: 250 });
    expect(u.points[4]).toEqual({ at: at(4).toISOString(), ...zero });
    expect(u.totals).toEqual({
      requests: 7,
      errors: 1,
      aborted: 1,
      promptTokens: 3_000_000_410,
      completionTokens: 800,
      tokensPerSecond: 800 / 300,
      // Seven requests: 50, 100, 100, 250 (the fourth: the median), 1000, 5000, >120 s.
      p50Ms: 250,
      p95Ms: 120_000,
      meanTtftMs: (300 + 500 + 40) / 5,
    });
  });

  it('steps of several minutes start at from; a range that starts mid-minute starts at its minute', async () => {
    const u = await usage({
      model: 'llama-7b',
      from: new Date(at(0).getTime() + 25_000).toISOString(),
      to: at(5).toISOString(),
      step: 2,
    });
    expect(u.from).toBe(at(0).toISOString());
    expect(u.points.map((p: { at: string; requests: number }) => [p.at, p.requests])).toEqual([
      [at(0).toISOString(), 6],
      [at(2).toISOString(), 1],
      [at(4).toISOString(), 0],
    ]);
    expect(u.points[0].tokensPerSecond).toBe(740 / 120);
  });

  it('filters by adapter ("" is the base model alone), by token, and all models when none is named', async () => {
    const range = { from: at(0).toISOString(), to: at(5).toISOString(), step: 5 };
    expect((await usage({ ...range, model: 'llama-7b', adapter: 'sql-helper' })).totals).toMatchObject({
      requests: 1,
      aborted: 1,
    });
    expect((await usage({ ...range, model: 'llama-7b', adapter: '' })).totals.requests).toBe(6);
    expect((await usage({ ...range, token: alice.tokenId })).totals.requests).toBe(5);
    // Console sessions of any model: bob's playground minute and the other model's rows.
    expect((await usage({ ...range, token: '' })).totals.requests).toBe(8);
    expect((await usage(range)).totals.requests).toBe(14);
  });

  it("a VIEWER reads only their own usage; another user's token reads as no usage, not as a refusal", async () => {
    const range = { from: at(0).toISOString(), to: at(5).toISOString(), step: 5 };
    expect((await usage(range, alice.secret)).totals).toMatchObject({ requests: 5, promptTokens: 400 });
    // Bob's token and his console session are both his.
    expect((await usage(range, bob.secret)).totals.requests).toBe(2);
    const asked = await usage({ ...range, token: bob.tokenId }, alice.secret);
    expect(asked.points).toEqual([{ at: at(0).toISOString(), ...zero }]);
    expect(asked.totals).toEqual({ ...zero });
    expect((await usage({ ...range, model: 'other' }, alice.secret)).totals.requests).toBe(0);
    expect((await usage({ ...range, model: 'other' })).totals.requests).toBe(7);
  });

  it('refuses a range backwards, longer than 31 days, or of too many points, naming the field', async () => {
    const r = (vars: Record<string, unknown>) => usage({ model: 'llama-7b', ...vars });
    expect(await r({ from: at(5).toISOString(), to: at(0).toISOString() })).toEqual({
      __typename: 'ValidationError',
      field: 'to',
      message: `to must be after from: ${at(0).toISOString()} is not after ${at(5).toISOString()}; swap them or move to later`,
    });
    expect(await r({ from: at(0).toISOString(), to: at(32 * 1440).toISOString(), step: 60 })).toEqual({
      __typename: 'ValidationError',
      field: 'from',
      message: 'from is 32.0 days before to; at most 31: ask for a shorter range, or for several',
    });
    expect(await r({ from: at(0).toISOString(), to: at(60).toISOString(), step: 0 })).toEqual({
      __typename: 'ValidationError',
      field: 'step',
      message: 'step is whole minutes from 1 to 1440 (a day): 0 is not accepted',
    });
    expect(await r({ from: at(0).toISOString(), to: at(31 * 1440).toISOString() })).toEqual({
      __typename: 'ValidationError',
      field: 'step',
      message: 'at 1-minute steps this range is 44640 points; at most 1440: use a step of 31 minutes or more',
    });
    expect((await r({ from: at(0).toISOString(), to: at(31 * 1440).toISOString(), step: 31 })).points).toHaveLength(
      1440,
    );
  });
});

describe('ApiToken.usage', () => {
  const TOKENS = `query($from: DateTime!, $to: DateTime!) {
    apiTokens(all: true) { name usage(from: $from, to: $to) { __typename ... on UsageTotals { requests promptTokens completionTokens } ... on ValidationError { field } } }
  }`;

  it("gives each token's totals, all tokens read in one query", async () => {
    const admin = await t.login();
    const read = vi.spyOn(t.app.services.usage, 'totalsByToken');
    const r = await t.gql(TOKENS, { from: at(0).toISOString(), to: at(5).toISOString() }, admin);
    expect(r.errors).toBeUndefined();
    const byName = Object.fromEntries(
      ((r.data?.apiTokens ?? []) as { name: string; usage: unknown }[]).map((tk) => [tk.name, tk.usage]),
    );
    expect(byName['alice@example.com-script']).toEqual({
      __typename: 'UsageTotals',
      requests: 5,
      promptTokens: 400,
      completionTokens: 720,
    });
    expect(byName['bob@example.com-script']).toMatchObject({ requests: 1, promptTokens: 10 });
    expect(byName['usage-ops']).toMatchObject({ requests: 0 });
    expect(read).toHaveBeenCalledTimes(1);
    read.mockRestore();

    const bad = await t.gql(TOKENS, { from: at(5).toISOString(), to: at(0).toISOString() }, admin);
    expect(((bad.data?.apiTokens ?? []) as { usage: unknown }[])[0]?.usage).toEqual({
      __typename: 'ValidationError',
      field: 'to',
    });
  });
});

describe('the Models page fields', () => {
  it("shows a model's last request and idle time, and each replica's load from the gateway", async () => {
    const model = await t.app.db.prisma.catalogModel.create({
      data: {
        name: 'usage-on-demand',
        source: 'http://mirror.example/m.gguf',
        engine: 'llamacpp',
        minReplicas: 0,
        idleSeconds: 600,
        lastRequestAt: at(3),
        // One that serves: a stopped replica is no longer listed on its model (fleet/current.ts).
        replicas: { create: { state: 'READY' } },
      },
    });
    const r = await t.gql(
      '{ model(name: "usage-on-demand") { lastRequestAt idleSeconds waiting replicas { inFlight failing } } }',
      {},
      { token: operator },
    );
    expect(r.errors).toBeUndefined();
    expect(r.data?.model).toEqual({
      lastRequestAt: at(3).toISOString(),
      idleSeconds: 600,
      waiting: 0,
      replicas: [{ inFlight: 0, failing: null }],
    });

    // What the gateway reports, as it would with requests on their way (its own tests make them for real): an
    // operator reads why a replica is set aside; a viewer only that it is, since the reason can name its endpoint.
    const load = vi.spyOn(t.app.services.gateway, 'load').mockReturnValue({
      inFlight: 2,
      failing: 'connect ECONNREFUSED 10.0.0.5:8080',
      failingUntil: new Date(Date.now() + 10_000),
    });
    const waiting = vi.spyOn(t.app.services.gateway, 'waiting').mockReturnValue(3);
    const LOAD = '{ model(name: "usage-on-demand") { waiting replicas { inFlight failing } } }';
    expect((await t.gql(LOAD, {}, { token: operator })).data?.model).toEqual({
      waiting: 3,
      replicas: [{ inFlight: 2, failing: 'connect ECONNREFUSED 10.0.0.5:8080' }],
    });
    expect((await t.gql(LOAD, {}, { token: alice.secret })).data?.model).toEqual({
      waiting: 3,
      replicas: [{ inFlight: 2, failing: 'set aside after a failed request (an operator sees why)' }],
    });
    expect(waiting).toHaveBeenCalledWith('usage-on-demand');
    load.mockRestore();
    waiting.mockRestore();
    await t.app.db.prisma.catalogModel.delete({ where: { id: model.id } });
  });
});
