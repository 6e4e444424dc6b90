import { render, screen, within } from '@testing-library/react';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import {
  idleWords,
  lastHour,
  latencyWords,
  type ModelLive_Model,
  ModelLive_UsageQuery,
  usageWords,
} from './model-live';
import { ModelsPage, ModelsPage_ModelsQuery } from './models-page';

const MIN = 60_000;

function model(name: string, over: Record<string, unknown> = {}) {
  return {
    __typename: 'Model',
    id: `m-${name}`,
    name,
    source: `http://hangar.test/mirror/${name}/Q4_K_M/`,
    engine: 'llamacpp',
    contextSize: 8192,
    memoryBytes: null,
    measuredMemoryBytes: null,
    memoryEstimateError: null,
    parallel: 1,
    mode: 'ALWAYS',
    wantedReplicas: 1,
    minReplicas: 1,
    targetInFlight: null,
    declared: false,
    declaredIn: null,
    modeMessage: 'always: the replicas it wants run',
    routing: 'PREFIX',
    fallbacks: [],
    owner: null,
    awakeUntil: null,
    adapters: [],
    replicas: [],
    ...over,
  };
}

const replica = (id: string, state: string, over: Record<string, unknown> = {}) => ({
  __typename: 'Replica',
  id,
  state,
  desired: 'RUN',
  message: null,
  smokeText: null,
  tokensPerSecond: null,
  timeToFirstTokenMs: null,
  endpoint: null,
  gpuLayers: null,
  totalLayers: null,
  vramUsedBytes: null,
  memoryMeasured: false,
  cards: [],
  updatedAt: new Date().toISOString(),
  node: { __typename: 'Node', id: `n-${id}`, name: `gpu-${id}` },
  inFlight: 0,
  failing: null,
  ...over,
});

/** An hour of points as the server sends it: every minute present, zeros where nothing was served. */
function points(from: string, busy: Record<number, [number, number]>) {
  return Array.from({ length: 60 }, (_, i) => ({
    __typename: 'UsagePoint',
    at: new Date(new Date(from).getTime() + i * MIN).toISOString(),
    requests: busy[i]?.[0] ?? 0,
    errors: busy[i]?.[1] ?? 0,
  }));
}

describe('a model card’s live usage', () => {
  it('shows the last hour: a bar per minute, requests, tok/s, p50/p95 and errors, and the load per replica', async () => {
    const qwen = model('qwen3-8b', {
      replicas: [replica('1', 'READY'), replica('2', 'READY'), replica('3', 'STOPPED')],
    });
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [qwen] })),
      answer(ModelLive_UsageQuery, (v) => ({
        model: {
          ...qwen,
          lastRequestAt: new Date().toISOString(),
          idleSeconds: 900,
          waiting: 0,
          replicas: [
            replica('1', 'READY', { inFlight: 3 }),
            replica('2', 'READY', { failing: 'refused the connection' }),
            replica('3', 'STOPPED'),
          ],
        },
        usage: {
          __typename: 'Usage',
          points: points(v.from, { 58: [40, 1], 59: [2, 0] }),
          totals: {
            __typename: 'UsageTotals',
            requests: 42,
            errors: 1,
            aborted: 0,
            completionTokens: 6480,
            tokensPerSecond: 1.8,
            p50Ms: 250,
            p95Ms: 2500,
            meanTtftMs: 118.4,
          },
        },
      })),
    ]);
    render(
      <Provider value={fake.client}>
        <ModelsPage canChange />
      </Provider>,
    );
    const card = await screen.findByTestId('model-qwen3-8b');
    expect(await within(card).findByTestId('usage-words')).toHaveTextContent(
      'Last hour: 42 requests · 0.7 a minute · 1.8 tok/s · p50 ≤ 250 ms · p95 ≤ 2.5 s · 1 error · first token 118 ms on average',
    );
    const chart = within(card).getByRole('img', {
      name: /Requests per minute over the last hour, at most 40 a minute/,
    });
    // Sixty minutes: two with requests (one with an error), the rest empty and drawn as nothing.
    expect(chart.querySelectorAll('title')).toHaveLength(60);
    expect(chart.querySelectorAll('rect.bar')).toHaveLength(2);
    expect(chart.querySelectorAll('rect.bar-error')).toHaveLength(1);
    const load = within(card).getByRole('list', { name: 'Load on qwen3-8b' });
    expect(
      within(load)
        .getAllByRole('listitem')
        .map((li) => li.textContent),
    ).toEqual(['gpu-1: 3 in flight', 'gpu-2: 0 in flight · failing: refused the connection']);
    // The window is the last hour up to the minute under way.
    const sent = fake.sent(ModelLive_UsageQuery)[0]?.variables;
    expect(sent?.name).toBe('qwen3-8b');
    expect(new Date(sent?.to ?? 0).getTime() - new Date(sent?.from ?? 0).getTime()).toBe(60 * MIN);
    expect(new Date(sent?.to ?? 0).getTime() % MIN).toBe(0);
  });

  it('says when an on-demand model served last, when it stops, and how many requests wait for it', async () => {
    const last = new Date(Date.now() - 3 * MIN - 5000).toISOString();
    const coder = model('coder', { mode: 'ON_DEMAND', replicas: [replica('1', 'READY')] });
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [coder] })),
      answer(ModelLive_UsageQuery, (v) => ({
        model: {
          ...coder,
          lastRequestAt: last,
          awakeUntil: new Date(new Date(last).getTime() + 900_000).toISOString(),
          idleSeconds: 900,
          waiting: 2,
        },
        usage: {
          __typename: 'Usage',
          points: points(v.from, {}),
          totals: {
            __typename: 'UsageTotals',
            requests: 0,
            errors: 0,
            aborted: 0,
            completionTokens: 0,
            tokensPerSecond: 0,
            p50Ms: null,
            p95Ms: null,
            meanTtftMs: null,
          },
        },
      })),
    ]);
    render(
      <Provider value={fake.client}>
        <ModelsPage canChange={false} />
      </Provider>,
    );
    const card = await screen.findByTestId('model-coder');
    expect(await within(card).findByTestId('idle-words')).toHaveTextContent('last request 3 min ago · stops in 12 min');
    // A viewer (no changes offered) is shown their own requests alone, and told so.
    expect(within(card).getByText('None of your requests in the last hour.')).toBeInTheDocument();
    expect(within(card).getByText('2 requests are waiting for it to wake')).toBeInTheDocument();
  });
});

describe('live words', () => {
  const now = Date.parse('2026-12-01T12:30:20Z');
  const base: ModelLive_Model = {
    id: 'm',
    mode: 'ON_DEMAND',
    awakeUntil: null,
    lastRequestAt: null,
    idleSeconds: 900,
    waiting: 0,
    replicas: [],
  };
  const running = [
    { id: 'r', state: 'READY' as const, desired: 'RUN' as const, inFlight: 0, failing: null, node: null },
  ];

  it('reads an on-demand model’s idle time from its last request', () => {
    expect(idleWords({ ...base, mode: 'ALWAYS' }, now)).toBeNull();
    expect(idleWords(base, now)).toBe('no request yet · asleep: the next request wakes it');
    const last = new Date(now - 3 * MIN).toISOString();
    // Before the gateway's batch has moved awakeUntil, the last request plus the idle time says when.
    expect(idleWords({ ...base, lastRequestAt: last, replicas: running }, now)).toBe(
      'last request 3 min ago · stops in 12 min',
    );
    expect(idleWords({ ...base, lastRequestAt: new Date(now - 20 * MIN).toISOString(), replicas: running }, now)).toBe(
      'last request 20 min ago · idle 15 min: stopping',
    );
    expect(idleWords({ ...base, lastRequestAt: last }, now)).toBe(
      'last request 3 min ago · asleep: the next request wakes it',
    );
  });

  it('bounds latency as the histogram does, and moves the window a minute at a time', () => {
    expect(latencyWords(null)).toBe('—');
    expect(latencyWords(250)).toBe('≤ 250 ms');
    expect(latencyWords(2500)).toBe('≤ 2.5 s');
    expect(latencyWords(120_000)).toBe('≥ 60 s');
    expect(lastHour(now)).toEqual({ from: '2026-12-01T11:31:00.000Z', to: '2026-12-01T12:31:00.000Z' });
  });

  it('tells a viewer the numbers are their own requests', () => {
    const totals = {
      requests: 1,
      errors: 0,
      aborted: 1,
      completionTokens: 12,
      tokensPerSecond: 0.2,
      p50Ms: 100,
      p95Ms: 100,
      meanTtftMs: null,
    };
    expect(usageWords(totals, true)).toBe(
      'Your last hour: 1 request · 0.0 a minute · 0.2 tok/s · p50 ≤ 100 ms · p95 ≤ 100 ms · 0 errors · 1 aborted',
    );
  });
});
