import { act, render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it, vi } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { ModelCard_SetModeMutation, ModelCard_WakeMutation, smokeWords } from './model-card';
import { ModelOwner_SetMutation } from './model-owner';
import { ModelsPage, ModelsPage_ChangedSubscription, ModelsPage_ModelsQuery } from './models-page';

const GiB = 1024 ** 3;
const now = new Date().toISOString();

function replica(id: string, state: string, over: Record<string, unknown> = {}) {
  return {
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
    updatedAt: now,
    node: null,
    ...over,
  };
}

const node = (name: string) => ({ __typename: 'Node', id: `n-${name}`, name });

/** A catalog model as the server sends it. */
function model(name: string, over: Record<string, unknown> = {}) {
  return {
    __typename: 'Model',
    id: `m-${name}`,
    name,
    source: `http://hangar.test/mirror/${name}/Q4_K_M/`,
    engine: 'llamacpp',
    contextSize: 8192,
    memoryBytes: 6 * GiB,
    measuredMemoryBytes: null,
    memoryEstimateError: null,
    parallel: 1,
    mode: 'ALWAYS',
    wantedReplicas: 2,
    minReplicas: 2,
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

function renderPage(fake: ReturnType<typeof fakeClient>, canChange = true) {
  return render(
    <Provider value={fake.client}>
      <ModelsPage canChange={canChange} />
    </Provider>,
  );
}

const card = (name: string) => screen.findByTestId(`model-${name}`);

describe('ModelsPage', () => {
  it('shows each replica in one line, with the server’s reasons word for word', async () => {
    const qwen = model('qwen3-8b', {
      adapters: [
        {
          __typename: 'Adapter',
          id: 'a1',
          name: 'support-tone',
          source: 'http://x/a.gguf',
          owner: 'user:5f0c…',
          ownerName: 'user:ana',
        },
      ],
      replicas: [
        replica('r1', 'READY', { node: node('gpu-1'), tokensPerSecond: 41.5 }),
        replica('r2', 'PENDING', { message: 'fits on no node: needs 9.8 GiB, the most free is 7.5 GiB on gpu-2' }),
        replica('r3', 'LOST', { node: node('gpu-2'), message: 'node gpu-2 stopped reporting' }),
      ],
    });
    renderPage(fakeClient([answer(ModelsPage_ModelsQuery, () => ({ models: [qwen, model('tiny')] }))]));

    const qwenCard = await card('qwen3-8b');
    const chips = within(within(qwenCard).getByRole('list', { name: 'Replicas of qwen3-8b' })).getAllByRole('listitem');
    expect(chips.map((c) => c.textContent)).toEqual([
      'READY on gpu-1 · 41.5 tok/s',
      'PENDING: fits on no node: needs 9.8 GiB, the most free is 7.5 GiB on gpu-2',
      'LOST: node gpu-2 stopped reporting',
    ]);
    expect(within(qwenCard).getByRole('list', { name: 'Adapters of qwen3-8b' })).toHaveTextContent(
      'support-tone · user:ana',
    );
    expect(within(qwenCard).getByText('http://hangar.test/mirror/qwen3-8b/Q4_K_M/')).toHaveClass('url');
    expect(within(qwenCard).getByText('6.0 GiB estimated')).toBeInTheDocument();
    expect(within(await card('tiny')).getByText('No adapters.')).toBeInTheDocument();
    // Followed live, not polled: the page says so.
    expect(screen.getByText(/Connecting for live updates|Live: cards follow/)).toBeInTheDocument();
  });

  it('shows how the gateway routes each model, and the fallbacks it answers from', async () => {
    renderPage(
      fakeClient([
        answer(ModelsPage_ModelsQuery, () => ({
          models: [model('qwen3-8b', { fallbacks: ['tiny', 'coder'] }), model('tiny', { routing: 'LEAST_LOADED' })],
        })),
      ]),
    );
    const qwen = within(await card('qwen3-8b')).getByTestId('model-routing');
    expect(qwen).toHaveTextContent('by prefix');
    expect(within(qwen).getByTestId('model-fallbacks')).toHaveTextContent('then tiny, then coder');
    const tiny = within(await card('tiny')).getByTestId('model-routing');
    expect(tiny).toHaveTextContent('least loaded');
    expect(within(tiny).queryByTestId('model-fallbacks')).toBeNull();
  });

  it("shows the smoke test through the replica's endpoint, what it holds, and the estimate's error", async () => {
    const qwen = model('qwen3-8b', {
      measuredMemoryBytes: 6.42 * GiB,
      memoryEstimateError: 0.07,
      parallel: 4,
      replicas: [
        replica('r1', 'READY', {
          node: node('gpu-1'),
          tokensPerSecond: 41.5,
          timeToFirstTokenMs: 118.4,
          smokeText: ' Hello there!',
          vramUsedBytes: 6.42 * GiB,
          gpuLayers: 37,
          totalLayers: 37,
          endpoint: 'http://10.0.0.5:8080/v1',
          message: 'loaded with a 4096-token context',
        }),
        replica('r2', 'READY', {
          node: node('gpu-2'),
          tokensPerSecond: 9.2,
          timeToFirstTokenMs: 900,
          vramUsedBytes: 2 * GiB,
          gpuLayers: 10,
          totalLayers: 37,
        }),
        replica('r3', 'FAILED', {
          node: node('gpu-3'),
          message: 'smoke test: http://10.0.0.7:8080/v1/chat/completions refused the engine key (HTTP 401)',
        }),
      ],
    });
    renderPage(fakeClient([answer(ModelsPage_ModelsQuery, () => ({ models: [qwen] }))]));
    const qwenCard = await card('qwen3-8b');
    const chips = within(within(qwenCard).getByRole('list', { name: 'Replicas of qwen3-8b' })).getAllByRole('listitem');
    expect(chips.map((c) => c.textContent)).toEqual([
      'READY on gpu-1 · 41.5 tok/s · first token 118 ms · 6.4 GiB on GPU · said "Hello there!": loaded with a 4096-token context',
      'READY on gpu-2 · 9.2 tok/s · first token 900 ms · 2.0 GiB on GPU (10 of 37 layers)',
      'FAILED on gpu-3: smoke test: http://10.0.0.7:8080/v1/chat/completions refused the engine key (HTTP 401)',
    ]);
    expect(chips[0]).toHaveAttribute('title', expect.stringContaining('serves on http://10.0.0.5:8080/v1'));
    expect(within(qwenCard).getByTestId('measured-memory')).toHaveTextContent(
      '6.4 GiB measured · +7% over the estimate',
    );
    expect(within(qwenCard).getByText('4 requests per replica')).toBeInTheDocument();
  });

  it('says what each replica holds on which card of its node: measured, planned, or split over two', async () => {
    const card24 = (index: number, heldBytes: number) => ({
      __typename: 'ReplicaCard',
      index,
      totalBytes: 24 * GiB,
      heldBytes,
    });
    const shared = model('qwen3-8b', {
      replicas: [
        replica('r1', 'READY', {
          node: node('node-a'),
          vramUsedBytes: 7.9 * GiB,
          gpuLayers: 37,
          totalLayers: 37,
          memoryMeasured: true,
          cards: [card24(0, 7.9 * GiB)],
        }),
        replica('r2', 'LOADING', { node: node('node-a'), cards: [card24(0, 8 * GiB)] }),
        replica('r3', 'PENDING', {
          message: 'fits on no node: needs 8.0 GiB, the most room is 5.6 GiB on node-a GPU 0',
        }),
      ],
    });
    const split = model('llama-70b', {
      replicas: [replica('s1', 'READY', { node: node('node-b'), cards: [card24(0, 15 * GiB), card24(1, 15 * GiB)] })],
    });
    renderPage(fakeClient([answer(ModelsPage_ModelsQuery, () => ({ models: [shared, split] }))]));
    const chipsOf = async (name: string) =>
      within(within(await card(name)).getByRole('list', { name: `Replicas of ${name}` }))
        .getAllByRole('listitem')
        .map((c) => c.textContent);
    expect(await chipsOf('qwen3-8b')).toEqual([
      'READY on node-a GPU 0: 7.9 GiB of 24 GiB',
      'LOADING on node-a GPU 0: 8.0 GiB of 24 GiB (planned)',
      'PENDING: fits on no node: needs 8.0 GiB, the most room is 5.6 GiB on node-a GPU 0',
    ]);
    expect(await chipsOf('llama-70b')).toEqual([
      'READY on node-b GPU 0: 15 GiB of 24 GiB, GPU 1: 15 GiB of 24 GiB (planned)',
    ]);
  });

  it('sets how many requests a replica answers at once, sending only a change', async () => {
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [model('qwen3-8b')] })),
      answer(ModelCard_SetModeMutation, (v) => ({
        setModelMode: model(v.name, { mode: v.mode, parallel: v.parallel ?? 1 }),
      })),
    ]);
    renderPage(fake);
    const user = userEvent.setup();
    const qwen = await card('qwen3-8b');
    const form = within(qwen).getByRole('form', { name: 'Mode of qwen3-8b' });
    const atOnce = within(form).getByLabelText('At once');
    await user.clear(atOnce);
    await user.type(atOnce, '8');
    await user.click(within(form).getByRole('button', { name: 'Apply' }));
    await within(qwen).findByText('8 requests per replica');
    expect(fake.sent(ModelCard_SetModeMutation).map((op) => op.variables)).toEqual([
      { name: 'qwen3-8b', mode: 'ALWAYS', replicas: 2, parallel: 8 },
    ]);
  });

  it('says an autoscaled model wants a range of replicas, not its most', async () => {
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({
        models: [
          model('coder', { mode: 'ALWAYS', wantedReplicas: 3, minReplicas: 1, targetInFlight: 2 }),
          model('qwen3-8b', { mode: 'ALWAYS', wantedReplicas: 2, minReplicas: 2, targetInFlight: null }),
        ],
      })),
    ]);
    renderPage(fake);
    await within(await card('coder')).findByText('1–3, autoscaled');
    await within(await card('qwen3-8b')).findByText('2 wanted');
  });

  it('changes a model’s mode and replicas with the button, and shows the new mode', async () => {
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [model('qwen3-8b', { mode: 'STOPPED', wantedReplicas: 0 })] })),
      answer(ModelCard_SetModeMutation, (v) => ({
        setModelMode: model(v.name, {
          mode: v.mode,
          wantedReplicas: v.replicas ?? 1,
          modeMessage: `always: ${v.replicas} replicas are being placed`,
        }),
      })),
    ]);
    renderPage(fake);
    const user = userEvent.setup();
    const qwen = await card('qwen3-8b');
    const form = within(qwen).getByRole('form', { name: 'Mode of qwen3-8b' });

    await user.selectOptions(within(form).getByLabelText('Mode'), 'ALWAYS');
    // Nothing is sent on a mere selection.
    expect(fake.sent(ModelCard_SetModeMutation)).toHaveLength(0);
    const replicas = within(form).getByLabelText('Replicas');
    await user.clear(replicas);
    await user.type(replicas, '3');
    await user.click(within(form).getByRole('button', { name: 'Apply' }));

    await within(qwen).findByText('3 wanted');
    // The answer says what happens next, on the card.
    expect(within(qwen).getByTestId('mode-message')).toHaveTextContent('always: 3 replicas are being placed');
    expect(fake.sent(ModelCard_SetModeMutation).map((op) => op.variables)).toEqual([
      { name: 'qwen3-8b', mode: 'ALWAYS', replicas: 3, parallel: null },
    ]);
    expect(within(qwen).getByText('always', { selector: '.badge' })).toBeInTheDocument();
  });

  it('offers no changes to a declared model and says where to make them', async () => {
    renderPage(
      fakeClient([
        answer(ModelsPage_ModelsQuery, () => ({
          models: [
            model('declared-llama', {
              declared: true,
              declaredIn: { __typename: 'DeclaredIn', file: '/etc/hangar/hangar.yaml', key: 'models.1' },
            }),
          ],
        })),
      ]),
    );
    const llama = await card('declared-llama');
    // On the page, not only in a tooltip: the file and the key, for viewers too.
    expect(within(llama).getByTestId('declared-in')).toHaveTextContent(
      'declared-llama is declared in /etc/hangar/hangar.yaml at models.1: change models.1.mode (or its other keys) there',
    );
    expect(within(llama).getByText('declared')).toHaveClass('badge');
    expect(within(llama).queryByRole('form')).toBeNull();
    expect(within(llama).queryByRole('combobox')).toBeNull();
    expect(within(llama).queryByRole('button', { name: /Apply|Remove/ })).toBeNull();
  });

  it('wakes an on-demand model, and shows a refusal verbatim', async () => {
    let refuse = false;
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [model('coder', { mode: 'ON_DEMAND', wantedReplicas: 1 })] })),
      answer(ModelCard_WakeMutation, (v) =>
        refuse
          ? {
              wakeModel: {
                __typename: 'ConflictError',
                code: 'CONFLICT',
                message: 'coder is stopped: nothing to wake',
              },
            }
          : {
              // The idle time from now: a timer that has run out is not shown, nor one while no replica is ready.
              wakeModel: model(v.name, {
                mode: 'ON_DEMAND',
                wantedReplicas: 1,
                awakeUntil: new Date(Date.now() + 15 * 60_000).toISOString(),
                replicas: [replica('r-awake', 'READY')],
              }),
            },
      ),
    ]);
    renderPage(fake);
    const user = userEvent.setup();
    const coder = await card('coder');
    await user.click(within(coder).getByRole('button', { name: 'Wake' }));
    expect(await within(coder).findByText(/awake until/)).toBeInTheDocument();
    expect(fake.sent(ModelCard_WakeMutation).map((op) => op.variables)).toEqual([{ name: 'coder' }]);

    refuse = true;
    await user.click(within(coder).getByRole('button', { name: 'Wake' }));
    expect(await within(coder).findByRole('alert')).toHaveTextContent('coder is stopped: nothing to wake');
  });

  it('shows who may call a model, and lets an operator set the owner or make it public again', async () => {
    const owners: Record<string, string | null> = { 'team:acme/research': 'team:acme/research' };
    let current: string | null = null;
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [model('qwen3-8b', { owner: current })] })),
      answer(ModelOwner_SetMutation, ({ owner }) => {
        if (owner != null && !(owner in owners)) {
          return {
            setModelOwner: {
              __typename: 'ValidationError',
              message: 'owner: org acme has no team nope',
              code: 'VALIDATION',
              field: 'owner',
            },
          };
        }
        current = owner == null ? null : (owners[owner] ?? null);
        return { setModelOwner: { __typename: 'Model', id: 'm-qwen3-8b', owner: current } };
      }),
    ]);
    renderPage(fake);
    const user = userEvent.setup();
    const qwen = await card('qwen3-8b');
    expect(within(qwen).getByTestId('model-owner')).toHaveTextContent('none: every caller');
    const form = within(qwen).getByRole('form', { name: 'Owner of qwen3-8b' });
    expect(within(form).queryByRole('button', { name: 'Make public' })).toBeNull();
    expect(within(form).getByRole('button', { name: 'Set owner' })).toBeDisabled();

    await user.type(within(form).getByLabelText('Owner'), 'team:acme/nope');
    await user.click(within(form).getByRole('button', { name: 'Set owner' }));
    expect(await within(form).findByRole('alert')).toHaveTextContent('owner: org acme has no team nope');
    expect(within(qwen).getByTestId('model-owner')).toHaveTextContent('none: every caller');

    await user.clear(within(form).getByLabelText('Owner'));
    await user.type(within(form).getByLabelText('Owner'), 'team:acme/research');
    await user.click(within(form).getByRole('button', { name: 'Set owner' }));
    await vi.waitFor(() => expect(within(qwen).getByTestId('model-owner')).toHaveTextContent('team:acme/research'));
    expect(fake.sent(ModelOwner_SetMutation).map((o) => o.variables)).toEqual([
      { name: 'qwen3-8b', owner: 'team:acme/nope' },
      { name: 'qwen3-8b', owner: 'team:acme/research' },
    ]);
    expect(within(form).queryByRole('alert')).toBeNull();
    expect(within(form).getByLabelText('Owner')).toHaveValue('');

    await user.click(within(form).getByRole('button', { name: 'Make public' }));
    await vi.waitFor(() => expect(within(qwen).getByTestId('model-owner')).toHaveTextContent('none: every caller'));
    expect(fake.sent(ModelOwner_SetMutation)[2]?.variables).toEqual({ name: 'qwen3-8b', owner: null });
  });

  it('shows the owner to viewers without a form, and offers none for a declared model', async () => {
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({
        models: [model('owned', { owner: 'user:ana@example.com' }), model('kept', { declared: true })],
      })),
    ]);
    renderPage(fake, false);
    expect(within(await card('owned')).getByTestId('model-owner')).toHaveTextContent('user:ana@example.com');
    expect(screen.queryByRole('form', { name: /Owner of/ })).toBeNull();
  });

  it('explains how a model gets into an empty catalog', async () => {
    renderPage(fakeClient([answer(ModelsPage_ModelsQuery, () => ({ models: [] }))]));
    expect(await screen.findByText(/The catalog holds no model yet/)).toHaveTextContent(/served from the registry/);
    expect(screen.getByRole('link', { name: 'Mirror' })).toHaveAttribute('href', '/mirror');
  });
});

describe('a ready replica in words', () => {
  const ready = { state: 'READY', tokensPerSecond: 380, timeToFirstTokenMs: 42, smokeText: 'Hi', totalLayers: 3 };
  it('says a replica with no layer on the card runs on the CPU, not that it holds 0 B on the GPU', () => {
    expect(smokeWords({ ...ready, gpuLayers: 0, vramUsedBytes: 0 } as never)).toBe(
      ' · 380.0 tok/s · first token 42 ms · on the CPU · said "Hi"',
    );
    expect(smokeWords({ ...ready, gpuLayers: 3, vramUsedBytes: 2 * GiB } as never)).toContain('2.0 GiB on GPU');
  });
  it('follows the subscription: a replica becomes ready in place, a new model joins by name, a removed one leaves', async () => {
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({
        models: [model('b-model', { replicas: [replica('r1', 'LOADING', { node: node('gpu-1') })] }), model('d-model')],
      })),
    ]);
    renderPage(fake);
    const b = await card('b-model');
    await vi.waitFor(() => expect(fake.sent(ModelsPage_ChangedSubscription)).toHaveLength(1));
    act(() =>
      fake.push(ModelsPage_ChangedSubscription, {
        modelChanged: {
          __typename: 'ModelChange',
          modelId: 'm-b-model',
          model: model('b-model', {
            modeMessage: 'always: 2 replicas run',
            replicas: [replica('r1', 'READY', { node: node('gpu-1'), tokensPerSecond: 30 })],
          }),
        },
      }),
    );
    await within(b).findByText('READY on gpu-1 · 30.0 tok/s');
    expect(within(b).getByTestId('mode-message')).toHaveTextContent('always: 2 replicas run');

    act(() =>
      fake.push(ModelsPage_ChangedSubscription, {
        modelChanged: { __typename: 'ModelChange', modelId: 'm-c-model', model: model('c-model') },
      }),
    );
    await card('c-model');
    const names = () =>
      [...document.querySelectorAll<HTMLElement>('article[data-testid^="model-"]')].map((el) => el.dataset.testid);
    expect(names()).toEqual(['model-b-model', 'model-c-model', 'model-d-model']);

    act(() =>
      fake.push(ModelsPage_ChangedSubscription, {
        modelChanged: { __typename: 'ModelChange', modelId: 'm-b-model', model: null },
      }),
    );
    await vi.waitFor(() => expect(names()).toEqual(['model-c-model', 'model-d-model']));
  });
});
