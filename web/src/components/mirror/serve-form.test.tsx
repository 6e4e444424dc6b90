import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { MirrorPage, MirrorPage_MirrorQuery, MirrorPage_VersionQuery } from './mirror-page';
import { ServeForm_PlanQuery, ServeForm_ServeMutation } from './serve-form';

const GiB = 1024 ** 3;

/** One present version, as the mirror's listing sends it. */
function present(usedBy: unknown[] = []) {
  return {
    __typename: 'MirrorVersion',
    id: 'qwen3-8b/Q4_K_M',
    model: 'qwen3-8b',
    version: 'Q4_K_M',
    state: 'PRESENT',
    removed: false,
    fileCount: 1,
    kind: 'MODEL',
    architecture: null,
    files: [
      {
        __typename: 'MirrorFile',
        id: 'f1',
        file: 'qwen3-8b.gguf',
        state: 'PRESENT',
        bytesDone: 5 * GiB,
        bytesTotal: 5 * GiB,
        bytesPerSecond: null,
        sha256: 'a'.repeat(64),
        expectedSha256: 'a'.repeat(64),
        verified: true,
        error: null,
        url: 'http://hangar.test/mirror/qwen3-8b/Q4_K_M/qwen3-8b.gguf',
        sourceUrl: 'https://hub.test/qwen3-8b.gguf',
      },
    ],
    bytesDone: 5 * GiB,
    bytesTotal: 5 * GiB,
    percent: 100,
    bytesPerSecond: null,
    etaSeconds: null,
    retry: null,
    error: null,
    verified: true,
    url: 'http://hangar.test/mirror/qwen3-8b/Q4_K_M/',
    usedBy,
    updatedAt: new Date().toISOString(),
  };
}

const listing = (usedBy: unknown[] = []) => ({
  mirror: {
    __typename: 'Mirror',
    baseUrl: 'http://hangar.test/mirror',
    fetching: 0,
    present: 1,
    failed: 0,
    diskFreeBytes: 500 * GiB,
    families: [{ __typename: 'MirrorFamily', name: 'qwen', modelCount: 1, versions: [present(usedBy)] }],
  },
});

const plan = {
  __typename: 'ServePlan',
  name: 'qwen3-8b',
  engine: 'llamacpp',
  source: 'http://hangar.test/mirror/qwen3-8b/Q4_K_M/',
  architecture: 'qwen3',
  servable: true,
  verdict: 'llama.cpp b4567 loads qwen3',
  context: 8192,
  memoryBytes: 6.5 * GiB,
  fitsOn: [
    { __typename: 'PlanFit', node: 'gpu-1', fits: true, reason: 'fits: 40.2 GiB free' },
    { __typename: 'PlanFit', node: 'gpu-2', fits: false, reason: 'needs 6.5 GiB, 3.0 GiB free' },
  ],
};

describe('ServeForm on a mirror row', () => {
  it('shows the plan before anything is confirmed, then serves under the edited name', async () => {
    let served = false;
    const usedBy = () =>
      served
        ? [
            {
              __typename: 'ModelUse',
              name: 'qwen-chat',
              mode: 'ALWAYS',
              replicas: 2,
              maxReplicas: 2,
              declared: false,
              adapterOf: null,
            },
          ]
        : [];
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing(usedBy())),
      answer(MirrorPage_VersionQuery, () => ({ mirrorVersion: present(usedBy()) })),
      answer(ServeForm_PlanQuery, () => ({ servePlan: plan })),
      answer(ServeForm_ServeMutation, (v) => {
        served = true;
        return {
          serveMirrorVersion: {
            __typename: 'ServePlaced',
            message: `${v.name} is in the catalog: replicas are placed on the next pass`,
            plan: { ...plan, name: v.name },
            model: {
              __typename: 'Model',
              id: 'm1',
              name: v.name,
              source: plan.source,
              engine: 'llamacpp',
              contextSize: v.context,
              memoryBytes: plan.memoryBytes,
              mode: v.mode,
              wantedReplicas: v.replicas,
              declared: false,
              awakeUntil: null,
              adapters: [],
              replicas: [],
            },
          },
        };
      }),
    ]);
    render(
      <Provider value={fake.client}>
        <MirrorPage canChange />
      </Provider>,
    );
    const user = userEvent.setup();
    const row = await screen.findByTestId('version-qwen3-8b/Q4_K_M');
    await user.click(within(row).getByRole('button', { name: 'Serve' }));

    const form = await screen.findByRole('region', { name: 'Serve qwen3-8b/Q4_K_M' });
    const facts = await within(form).findByLabelText('The plan');
    expect(facts).toHaveTextContent('Enginellama.cpp');
    expect(facts).toHaveTextContent('Architectureqwen3');
    expect(facts).toHaveTextContent('Verdictllama.cpp b4567 loads qwen3');
    expect(facts).toHaveTextContent('Memory6.5 GiB at 8,192 tokens');
    expect(
      within(facts)
        .getAllByRole('listitem')
        .map((li) => li.textContent),
    ).toEqual(['gpu-1: fits: 40.2 GiB free', 'gpu-2: needs 6.5 GiB, 3.0 GiB free']);
    // Nothing is served by opening the form.
    expect(fake.sent(ServeForm_ServeMutation)).toHaveLength(0);

    const name = within(form).getByLabelText('Name');
    expect(name).toHaveValue('qwen3-8b');
    await user.clear(name);
    await user.type(name, 'qwen-chat');
    await user.clear(within(form).getByLabelText('Replicas'));
    await user.type(within(form).getByLabelText('Replicas'), '2');
    await user.click(within(form).getByRole('button', { name: 'Put into service' }));

    expect(await within(form).findByRole('status')).toHaveTextContent(
      'qwen-chat is in the catalog: replicas are placed on the next pass',
    );
    expect(fake.sent(ServeForm_ServeMutation).map((op) => op.variables)).toEqual([
      { model: 'qwen3-8b', version: 'Q4_K_M', name: 'qwen-chat', context: 8192, mode: 'ALWAYS', replicas: 2 },
    ]);
    // The version's "used by" is read again (that version alone, not the listing), and links to the Models page.
    const used = await within(row).findByRole('link', { name: 'used by qwen-chat' });
    expect(used).toHaveAttribute('href', '/models');
    expect(fake.sent(MirrorPage_VersionQuery).map((op) => op.variables)).toEqual([
      { model: 'qwen3-8b', version: 'Q4_K_M' },
    ]);
    expect(fake.sent(MirrorPage_MirrorQuery)).toHaveLength(1);
  });

  it('shows a refusal next to the field it names', async () => {
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing()),
      answer(ServeForm_PlanQuery, () => ({ servePlan: plan })),
      answer(ServeForm_ServeMutation, () => ({
        serveMirrorVersion: {
          __typename: 'ValidationError',
          code: 'VALIDATION',
          field: 'name',
          message: 'the catalog already has a model qwen3-8b',
        },
      })),
    ]);
    render(
      <Provider value={fake.client}>
        <MirrorPage canChange />
      </Provider>,
    );
    const user = userEvent.setup();
    const row = await screen.findByTestId('version-qwen3-8b/Q4_K_M');
    await user.click(within(row).getByRole('button', { name: 'Serve' }));
    const form = await screen.findByRole('region', { name: 'Serve qwen3-8b/Q4_K_M' });
    await within(form).findByLabelText('The plan');
    await user.click(within(form).getByRole('button', { name: 'Put into service' }));
    const name = within(form).getByLabelText('Name');
    await screen.findByText('the catalog already has a model qwen3-8b');
    expect(name).toHaveAttribute('aria-invalid', 'true');
    expect(name).toHaveAccessibleDescription('the catalog already has a model qwen3-8b');
  });
});
