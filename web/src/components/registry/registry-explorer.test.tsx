import { createMemoryHistory, RouterProvider } from '@tanstack/react-router';
import { act, render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { makeRouter } from '../../router';
import { answer, fakeClient } from '../../test/fake-client';
import { AppLayout_RegistrySettingsQuery, AppLayout_ViewerQuery } from '../layout/app-layout';
import { MirrorPage_MirrorQuery } from '../mirror/mirror-page';
import {
  FileSetRow_FetchMutation,
  FileSetRow_ServeMutation,
  FileSetRow_VersionChangedSubscription,
  FileSetRow_VersionQuery,
} from './file-set-row';
import { RegistryExplorer } from './registry-explorer';
import { RegistryResults_SearchQuery } from './registry-results';
import { RepoDetail_RepoQuery } from './repo-detail';
import { ServeJob_ChangedSubscription, ServeJob_JobQuery } from './serve-job';

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

/** A search result as the server sends it. */
function model(id: string, over: Record<string, unknown> = {}) {
  return {
    __typename: 'RegistryModel',
    id,
    downloads: 5000,
    likes: 12,
    lastModified: '2026-11-01T12:00:00.000Z',
    gated: false,
    hasGguf: true,
    ...over,
  };
}

function page(ids: string[], over: Record<string, unknown> = {}) {
  return {
    registrySearch: {
      __typename: 'RegistrySearch',
      nodes: ids.map((id) => model(id)),
      hasNextPage: false,
      endCursor: ids.length ? String(ids.length) : null,
      ...over,
    },
  };
}

const servable = {
  __typename: 'Verdict',
  servable: true,
  reason: 'qwen3 loads in llama.cpp b5092 and later; the newest known llama.cpp b6000',
  neededBuild: 5092,
};

/** A set as the server judges it: a servable Q4_K_M unless told otherwise. */
function set(id: string, over: Record<string, unknown> = {}) {
  const memory = {
    __typename: 'MemoryEstimate',
    context: 32768,
    weightsBytes: 5 * GiB,
    kvCacheBytes: 4.5 * GiB,
    overheadBytes: 512 * MiB,
    totalBytes: 10 * GiB,
    basis: '36 layers × 8 KV heads × 128 × 2 (K and V) × f16',
  };
  return {
    __typename: 'FileSet',
    id,
    kind: 'MODEL',
    format: 'GGUF',
    quant: 'Q4_K_M',
    files: [{ __typename: 'RegistryFile', path: 'Qwen3-8B-Q4_K_M.gguf', size: 5 * GiB, sha256: 'a'.repeat(64) }],
    shardCount: 1,
    complete: true,
    totalBytes: 5 * GiB,
    model: 'qwen3-8b',
    version: 'a1b2c3d-q4_k_m',
    headerBytesRead: 400_000,
    headerError: null,
    header: {
      __typename: 'GgufHeader',
      architecture: 'qwen3',
      contextLength: 40960,
      layers: 36,
      embeddingLength: 4096,
      heads: 32,
      kvHeads: 8,
      fileType: 'Q4_K_M',
      parameterCount: 8_190_000_000,
    },
    verdict: servable,
    memory,
    fits: {
      __typename: 'Fits',
      summary: 'fits on 1 of 2 online nodes',
      disk: { __typename: 'DiskFit', fits: true, freeBytes: 500 * GiB, neededBytes: 5 * GiB },
      nodes: [
        { __typename: 'NodeFit', node: 'gpu-1', fits: true, freeMiB: 20480, neededMiB: 10240, reason: 'ok' },
        { __typename: 'NodeFit', node: 'gpu-2', fits: false, freeMiB: 8192, neededMiB: 10240, reason: 'small' },
      ],
    },
    ...over,
  };
}

const mmprojReason = 'a vision/audio projector (mmproj): it is loaded beside a model with --mmproj, never as a model';

function repo(id: string, over: Record<string, unknown> = {}) {
  return {
    registryRepo: {
      __typename: 'RegistryRepo',
      id,
      revision: 'a1b2c3d4e5f60718293a4b5c6d7e8f9012345678',
      shortRevision: 'a1b2c3d',
      gated: false,
      noAccess: null,
      architecture: 'Qwen3ForCausalLM',
      url: `https://hub.test/${id}`,
      cardHtml: '<h1>Qwen3 8B</h1><p>A model.</p>',
      sets: [
        set('model:Qwen3-8B-Q4_K_M'),
        set('mmproj:mmproj-Qwen3-8B-F16', {
          kind: 'MMPROJ',
          quant: 'F16',
          version: 'a1b2c3d-mmproj-f16',
          totalBytes: 600 * MiB,
          files: [{ __typename: 'RegistryFile', path: 'mmproj-Qwen3-8B-F16.gguf', size: 600 * MiB, sha256: null }],
          verdict: { __typename: 'Verdict', servable: false, reason: mmprojReason, neededBuild: null },
        }),
      ],
      ...over,
    },
  };
}

/** A mirror version as fetchRepoSet and the mirror's listing send it. */
function mirrorVersion(modelName: string, versionName: string, state: string, over: Record<string, unknown> = {}) {
  return {
    __typename: 'MirrorVersion',
    id: `${modelName}/${versionName}`,
    model: modelName,
    version: versionName,
    state,
    removed: false,
    fileCount: 1,
    files: [],
    bytesDone: 0,
    bytesTotal: 5 * GiB,
    percent: 0,
    bytesPerSecond: null,
    etaSeconds: null,
    retry: null,
    error: null,
    verified: false,
    url: null,
    usedBy: [],
    kind: 'MODEL',
    architecture: 'qwen3',
    updatedAt: '2026-11-02T12:00:00.000Z',
    ...over,
  };
}

function started(modelName: string, versionName: string) {
  return {
    fetchRepoSet: {
      __typename: 'FetchStarted',
      message: `started fetching 1 file into ${modelName}/${versionName}`,
      started: 1,
      alreadyArriving: 0,
      alreadyPresent: 0,
      version: mirrorVersion(modelName, versionName, 'QUEUED'),
    },
  };
}

function renderExplorer(fake: ReturnType<typeof fakeClient>, canFetch = true) {
  return render(
    <Provider value={fake.client}>
      <RegistryExplorer canFetch={canFetch} />
    </Provider>,
  );
}

async function search(text: string) {
  const user = userEvent.setup();
  await user.type(screen.getByLabelText('Search the registry'), text);
  await user.click(screen.getByRole('button', { name: 'Search' }));
  return user;
}

/** The table row of a set, in the open repository. */
const setRow = (id: string) => screen.findByTestId(`set-${id}`);

describe('RegistryExplorer', () => {
  it('lists what the search finds and opens a repository in the row right beneath its own', async () => {
    const ids = ['acme/Qwen3-8B-GGUF', 'acme/Tiny-GGUF', 'meta/Gated-GGUF'];
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, () => ({
        registrySearch: {
          ...page(ids).registrySearch,
          nodes: [
            model(ids[0] as string, { downloads: 1_234_567 }),
            model(ids[1] as string, { hasGguf: false }),
            model(ids[2] as string, { gated: true }),
          ],
        },
      })),
      answer(RepoDetail_RepoQuery, ({ id }) => repo(id)),
    ]);
    renderExplorer(fake);
    // Nothing is asked of the registry before the operator searches.
    expect(screen.queryByRole('table')).toBeNull();
    const user = await search('acme');

    const first = await screen.findByRole('button', { name: 'acme/Qwen3-8B-GGUF' });
    const rowOf = (button: HTMLElement) => button.closest('tr') as HTMLTableRowElement;
    expect(rowOf(first)).toHaveTextContent('acme/Qwen3-8B-GGUFGGUF1.2M12');
    expect(within(rowOf(screen.getByRole('button', { name: 'acme/Tiny-GGUF' }))).queryByText('GGUF')).toBeNull();
    expect(within(rowOf(screen.getByRole('button', { name: 'meta/Gated-GGUF' }))).getByText('gated')).toBeVisible();
    expect(fake.sent(RegistryResults_SearchQuery)[0]?.variables).toEqual({
      query: 'acme',
      sort: 'downloads',
      first: 20,
      after: null,
    });

    const tiny = screen.getByRole('button', { name: 'acme/Tiny-GGUF' });
    await user.click(tiny);
    expect(tiny).toHaveAttribute('aria-expanded', 'true');
    const detail = await screen.findByRole('region', { name: 'acme/Tiny-GGUF' });
    // In the listing, not a dialog: the row right after the clicked one, spanning every column.
    const detailRow = detail.closest('tr') as HTMLTableRowElement;
    expect(rowOf(tiny).nextElementSibling).toBe(detailRow);
    expect(detailRow.cells).toHaveLength(1);
    expect(detailRow.cells[0]).toHaveAttribute('colspan', '4');
    expect(tiny).toHaveAttribute('aria-controls', detailRow.id);
    expect(screen.queryByRole('dialog')).toBeNull();
    expect(await within(detail).findByRole('table', { name: 'File sets of acme/Tiny-GGUF' })).toBeVisible();
    expect(fake.sent(RepoDetail_RepoQuery)[0]?.variables).toEqual({ id: 'acme/Tiny-GGUF', context: null });

    // One open at a time: opening another closes the first.
    await user.click(screen.getByRole('button', { name: 'meta/Gated-GGUF' }));
    const gated = await screen.findByRole('region', { name: 'meta/Gated-GGUF' });
    expect(screen.queryByRole('region', { name: 'acme/Tiny-GGUF' })).toBeNull();
    expect(tiny).toHaveAttribute('aria-expanded', 'false');
    expect(rowOf(screen.getByRole('button', { name: 'meta/Gated-GGUF' })).nextElementSibling).toBe(gated.closest('tr'));
    await user.click(within(gated).getByRole('button', { name: 'Close' }));
    expect(screen.queryByRole('region')).toBeNull();
    expect(screen.getAllByRole('button', { name: /\// })).toHaveLength(3);
  });

  it('shows each set’s size, verdict, memory and fits, the card folded, and fetches with the names as edited', async () => {
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, () => page(['acme/Qwen3-8B-GGUF'])),
      answer(RepoDetail_RepoQuery, ({ id }) => repo(id)),
      answer(FileSetRow_FetchMutation, ({ model: m, version: v }) => started(m ?? '', v ?? '')),
      answer(FileSetRow_VersionQuery, ({ model: m, version: v }) => ({
        mirrorVersion: mirrorVersion(m, v, 'QUEUED'),
      })),
    ]);
    renderExplorer(fake);
    const user = await search('qwen3');
    await user.click(await screen.findByRole('button', { name: 'acme/Qwen3-8B-GGUF' }));
    const detail = await screen.findByRole('region', { name: 'acme/Qwen3-8B-GGUF' });
    expect(await within(detail).findByText('a1b2c3d')).toHaveAttribute(
      'title',
      'revision a1b2c3d4e5f60718293a4b5c6d7e8f9012345678',
    );
    expect(within(detail).getByRole('link', { name: 'Open on the registry' })).toHaveAttribute(
      'href',
      'https://hub.test/acme/Qwen3-8B-GGUF',
    );

    const q4 = await setRow('model:Qwen3-8B-Q4_K_M');
    expect(within(q4).getByRole('rowheader')).toHaveTextContent('Q4_K_M');
    expect(q4).toHaveTextContent('qwen3 · 36 layers · 8.2B parameters · trained for 40,960 tokens');
    expect(q4).toHaveTextContent('5.0 GiB');
    expect(within(q4).getByText('servable')).toHaveClass('badge', 'ok');
    expect(q4).toHaveTextContent('10 GiB5.0 GiB weights + 4.5 GiB KV + 512 MiB overhead at 32,768 tokens');
    expect(q4).toHaveTextContent('fits on 1 of 2 online nodes');
    const nodes = within(q4).getByRole('list', { name: 'Nodes for Q4_K_M' });
    expect(within(nodes).getByText('gpu-1: fits')).toHaveClass('ok');
    expect(within(nodes).getByText('gpu-2: does not fit')).toHaveClass('bad');
    expect(q4).toHaveTextContent('mirror disk: 500 GiB free');
    expect(within(detail).getByText('Context')).toBeVisible();
    expect(within(detail).getByLabelText('Context')).toHaveAttribute('placeholder', '32768');

    // The files, on demand.
    const files = within(q4).getByRole('button', { name: '1 file' });
    await user.click(files);
    expect(screen.getByRole('table', { name: 'Files of Q4_K_M' })).toHaveTextContent(
      'Qwen3-8B-Q4_K_M.gguf5.0 GiBaaaaaaaaaaaa…',
    );
    await user.click(files);

    // The card, below the sets and folded until asked for.
    const card = within(detail).getByText('Model card').closest('details') as HTMLDetailsElement;
    expect(card.open).toBe(false);
    expect(within(card).getByRole('heading', { name: 'Qwen3 8B', hidden: true })).toBeInTheDocument();
    expect(
      within(detail).getByRole('table', { name: 'File sets of acme/Qwen3-8B-GGUF' }).compareDocumentPosition(card),
    ).toBe(Node.DOCUMENT_POSITION_FOLLOWING);

    const name = within(q4).getByLabelText('Model');
    const version = within(q4).getByLabelText('Version');
    expect(name).toHaveValue('qwen3-8b');
    // The server's suggestion for this set: its revision and its quantisation.
    expect(version).toHaveValue('a1b2c3d-q4_k_m');
    await user.clear(name);
    await user.type(name, 'qwen3-8b-chat');
    await user.clear(version);
    await user.type(version, 'q4km-a1b2c3d');
    await user.click(within(q4).getByRole('button', { name: 'Fetch' }));

    const status = await screen.findByRole('status');
    expect(status).toHaveTextContent('started fetching 1 file into qwen3-8b-chat/q4km-a1b2c3d');
    // Beside the set it was about.
    expect(q4.nextElementSibling).toContainElement(status);
    expect(fake.sent(FileSetRow_FetchMutation)[0]?.variables).toEqual({
      repo: 'acme/Qwen3-8B-GGUF',
      revision: 'a1b2c3d4e5f60718293a4b5c6d7e8f9012345678',
      set: 'model:Qwen3-8B-Q4_K_M',
      model: 'qwen3-8b-chat',
      version: 'q4km-a1b2c3d',
      force: false,
    });

    // Then the version as it arrives.
    const now = within(q4.nextElementSibling as HTMLElement).getByText(/is now/).parentElement as HTMLElement;
    expect(now).toHaveTextContent('qwen3-8b-chat/q4km-a1b2c3d is now queued');
    await vi.waitFor(() => expect(fake.sent(FileSetRow_VersionChangedSubscription)).toHaveLength(1));
    expect(fake.sent(FileSetRow_VersionChangedSubscription)[0]?.variables).toEqual({
      model: 'qwen3-8b-chat',
      version: 'q4km-a1b2c3d',
    });
    // A download sends progress about once a second. An event pushed before the version's first read has been
    // answered is overwritten by that answer (QUEUED again) until the next event: so the events keep coming here.
    await vi.waitFor(() => {
      act(() =>
        fake.push(FileSetRow_VersionChangedSubscription, {
          mirrorVersionChanged: mirrorVersion('qwen3-8b-chat', 'q4km-a1b2c3d', 'FETCHING', {
            bytesDone: 2.5 * GiB,
            percent: 50,
          }),
        }),
      );
      expect(now).toHaveTextContent('is now fetching 50.0 %');
    });
  });

  it('shows why a set cannot be served with no Fetch button, and fetches it anyway only when that is chosen', async () => {
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, () => page(['acme/Qwen3-8B-GGUF'])),
      answer(RepoDetail_RepoQuery, ({ id }) => repo(id)),
      answer(FileSetRow_FetchMutation, ({ model: m, version: v }) => started(m ?? '', v ?? '')),
      answer(FileSetRow_VersionQuery, ({ model: m, version: v }) => ({
        mirrorVersion: mirrorVersion(m, v, 'QUEUED'),
      })),
    ]);
    renderExplorer(fake);
    const user = await search('qwen3');
    await user.click(await screen.findByRole('button', { name: 'acme/Qwen3-8B-GGUF' }));

    const mmproj = await setRow('mmproj:mmproj-Qwen3-8B-F16');
    expect(within(mmproj).getByRole('rowheader')).toHaveTextContent('mmproj F16');
    expect(within(mmproj).getByText('not servable')).toHaveClass('badge', 'bad');
    expect(within(mmproj).getByText(mmprojReason)).toHaveClass('reason');
    // The reason, and no Fetch button: nothing to press that the server would only refuse.
    expect(within(mmproj).queryByRole('button', { name: 'Fetch' })).toBeNull();
    const anyway = within(mmproj).getByText('Fetch anyway…');
    const button = within(mmproj).getByRole('button', { name: 'Fetch anyway', hidden: true });
    expect(button).not.toBeVisible();
    // Forcing is a choice made on purpose: open the disclosure, then tick what it means.
    await user.click(anyway);
    expect(button).toBeVisible();
    expect(button).toBeDisabled();
    await user.click(within(mmproj).getByLabelText('Fetch it although it cannot be served here'));
    expect(button).toBeEnabled();
    await user.click(button);

    expect(await screen.findByRole('status')).toHaveTextContent(
      'started fetching 1 file into qwen3-8b/a1b2c3d-mmproj-f16',
    );
    expect(fake.sent(FileSetRow_FetchMutation).map((op) => [op.variables.force, op.variables.version])).toEqual([
      [true, 'a1b2c3d-mmproj-f16'],
    ]);
    // The servable set beside it has its plain Fetch, and no "anyway".
    const q4 = await setRow('model:Qwen3-8B-Q4_K_M');
    expect(within(q4).getByRole('button', { name: 'Fetch' })).toBeVisible();
    expect(within(q4).queryByText('Fetch anyway…')).toBeNull();
  });

  it('puts a name the server refuses next to its field', async () => {
    const message = "model: a model name is letters, digits, '.', '_' and '-', up to 100: 'my model' is not";
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, () => page(['acme/Qwen3-8B-GGUF'])),
      answer(RepoDetail_RepoQuery, ({ id }) => repo(id)),
      answer(FileSetRow_FetchMutation, () => ({
        fetchRepoSet: { __typename: 'ValidationError', code: 'VALIDATION', field: 'model', message },
      })),
    ]);
    renderExplorer(fake);
    const user = await search('qwen3');
    await user.click(await screen.findByRole('button', { name: 'acme/Qwen3-8B-GGUF' }));
    const q4 = await setRow('model:Qwen3-8B-Q4_K_M');
    const name = within(q4).getByLabelText('Model');
    await user.clear(name);
    await user.type(name, 'my model');
    await user.click(within(q4).getByRole('button', { name: 'Fetch' }));

    await vi.waitFor(() => expect(name).toHaveAttribute('aria-invalid', 'true'));
    expect(name).toHaveAccessibleDescription(message);
    expect(within(q4).getByLabelText('Version')).not.toHaveAttribute('aria-invalid');
    expect(fake.sent(FileSetRow_FetchMutation)[0]?.variables.model).toBe('my model');
  });

  it('says why a gated repository cannot be fetched, and offers no fetch that would be refused', async () => {
    const noAccess = 'gated: meta/Gated-GGUF needs an access token with access (HANGAR_HUB_TOKEN)';
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, () => page(['meta/Gated-GGUF'])),
      answer(RepoDetail_RepoQuery, ({ id }) => repo(id, { gated: true, noAccess })),
    ]);
    renderExplorer(fake);
    const user = await search('gated');
    await user.click(await screen.findByRole('button', { name: 'meta/Gated-GGUF' }));
    const detail = await screen.findByRole('region', { name: 'meta/Gated-GGUF' });
    expect(await within(detail).findByText(noAccess)).toBeVisible();
    const fetch = within(await setRow('model:Qwen3-8B-Q4_K_M')).getByRole('button', { name: 'Fetch' });
    expect(fetch).toBeDisabled();
    expect(fetch).toHaveAccessibleDescription(`No access: ${noAccess}`);
  });

  it('estimates again at the context asked for, and shows the server’s refusal of one at the field', async () => {
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, () => page(['acme/Qwen3-8B-GGUF'])),
      answer(RepoDetail_RepoQuery, ({ id, context }) => {
        if (context != null && context < 256) {
          return {
            registryRepo: {
              __typename: 'ValidationError',
              code: 'VALIDATION',
              field: 'context',
              message: 'context: Too small: expected number to be >=256',
            },
          };
        }
        const answer = repo(id);
        if (context) {
          answer.registryRepo.sets = answer.registryRepo.sets.map((s) => ({
            ...s,
            memory: { ...s.memory, context, kvCacheBytes: 576 * MiB, totalBytes: 6 * GiB },
          }));
        }
        return answer;
      }),
    ]);
    renderExplorer(fake);
    const user = await search('qwen3');
    await user.click(await screen.findByRole('button', { name: 'acme/Qwen3-8B-GGUF' }));
    const detail = await screen.findByRole('region', { name: 'acme/Qwen3-8B-GGUF' });
    const q4 = await setRow('model:Qwen3-8B-Q4_K_M');
    expect(q4).toHaveTextContent('at 32,768 tokens');

    await user.type(within(detail).getByLabelText('Context'), '4096{Enter}');
    await vi.waitFor(() =>
      expect(screen.getByTestId('set-model:Qwen3-8B-Q4_K_M')).toHaveTextContent('at 4,096 tokens'),
    );
    expect(screen.getByTestId('set-model:Qwen3-8B-Q4_K_M')).toHaveTextContent('6.0 GiB');
    expect(fake.sent(RepoDetail_RepoQuery).at(-1)?.variables).toEqual({ id: 'acme/Qwen3-8B-GGUF', context: 4096 });

    const input = within(detail).getByLabelText('Context');
    await user.clear(input);
    await user.type(input, '100{Enter}');
    await vi.waitFor(() =>
      expect(within(detail).getByLabelText('Context')).toHaveAccessibleDescription(
        'context: Too small: expected number to be >=256',
      ),
    );
    // The sets stay, at the last context the server accepted.
    expect(screen.getByTestId('set-model:Qwen3-8B-Q4_K_M')).toHaveTextContent('at 4,096 tokens');
  });

  it('shows an unreachable registry in its own place', async () => {
    const message = 'the registry could not be reached: connect ECONNREFUSED 127.0.0.1:9';
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, () => ({
        registrySearch: { __typename: 'UpstreamError', code: 'UPSTREAM', message },
      })),
    ]);
    renderExplorer(fake);
    await search('qwen3');
    const alert = await screen.findByRole('alert');
    expect(alert).toHaveTextContent(message);
    expect(screen.getByRole('table', { name: 'Registry repositories' })).toContainElement(alert);
    // The search box stays, for another try.
    expect(screen.getByLabelText('Search the registry')).toHaveValue('qwen3');
  });

  it('pages with Load more, and lists a viewer the same judgement without fetch buttons', async () => {
    const fake = fakeClient([
      answer(RegistryResults_SearchQuery, ({ after }) =>
        after == null
          ? page(['acme/A-GGUF', 'acme/B-GGUF'], { hasNextPage: true, endCursor: '2' })
          : page(['acme/C-GGUF'], { endCursor: '3' }),
      ),
      answer(RepoDetail_RepoQuery, ({ id }) => repo(id)),
    ]);
    renderExplorer(fake, false);
    const user = await search('acme');
    await user.click(await screen.findByRole('button', { name: 'Load more' }));
    await user.click(await screen.findByRole('button', { name: 'acme/C-GGUF' }));
    expect(new Set(fake.sent(RegistryResults_SearchQuery).map((op) => op.variables.after))).toEqual(
      new Set([null, '2']),
    );
    expect(screen.queryByRole('button', { name: 'Load more' })).toBeNull();

    const q4 = await setRow('model:Qwen3-8B-Q4_K_M');
    expect(within(q4).getByText('servable')).toBeVisible();
    expect(within(q4).queryByRole('button', { name: /Fetch/ })).toBeNull();
    expect(within(q4).queryByLabelText('Model')).toBeNull();
  });
});

describe('the explorer in the console', () => {
  const HUB = 'https://hub.test';
  let registryOn = true;
  const viewer = {
    __typename: 'Viewer',
    role: 'OPERATOR',
    via: 'session',
    tokenName: null,
    user: { __typename: 'User', id: 'u1', email: 'operator@example.com', name: 'Pat', role: 'OPERATOR' },
  };
  const emptyMirror = {
    __typename: 'Mirror',
    baseUrl: 'http://hangar.test/mirror',
    fetching: 0,
    present: 0,
    failed: 0,
    diskFreeBytes: 500 * GiB,
    families: [] as unknown[],
  };

  function renderAt(path: string, extra: ReturnType<typeof answer>[] = []) {
    const fake = fakeClient([
      answer(AppLayout_ViewerQuery, () => ({ viewer })),
      answer(AppLayout_RegistrySettingsQuery, () => ({
        registrySettings: { __typename: 'RegistrySettings', enabled: registryOn, siteUrl: registryOn ? HUB : null },
      })),
      answer(MirrorPage_MirrorQuery, () => ({ mirror: emptyMirror })),
      answer(RegistryResults_SearchQuery, () => page(['acme/Qwen3-8B-GGUF', 'acme/Tiny-GGUF'])),
      answer(RepoDetail_RepoQuery, ({ id }) => repo(id)),
      ...extra,
    ]);
    const router = makeRouter(fake.client, createMemoryHistory({ initialEntries: [path] }));
    render(
      <Provider value={fake.client}>
        <RouterProvider router={router} />
      </Provider>,
    );
    return { fake, router };
  }

  it('keeps the search and the open repository in the URL, so a link shows the same thing', async () => {
    const { router, fake } = renderAt('/registry?q=acme&repo=acme%2FTiny-GGUF&ctx=8192');
    expect(await screen.findByRole('heading', { name: 'Registry', level: 1 })).toBeInTheDocument();
    const detail = await screen.findByRole('region', { name: 'acme/Tiny-GGUF' });
    const row = screen.getByRole('button', { name: 'acme/Tiny-GGUF' }).closest('tr');
    expect(row?.nextElementSibling).toBe(detail.closest('tr'));
    expect(screen.getByLabelText('Search the registry')).toHaveValue('acme');
    expect(await within(detail).findByLabelText('Context')).toHaveValue(8192);
    expect(fake.sent(RepoDetail_RepoQuery)[0]?.variables).toEqual({ id: 'acme/Tiny-GGUF', context: 8192 });

    const user = userEvent.setup();
    await user.click(screen.getByRole('button', { name: 'acme/Qwen3-8B-GGUF' }));
    await vi.waitFor(() =>
      expect(router.state.location.search).toEqual({ q: 'acme', repo: 'acme/Qwen3-8B-GGUF', ctx: 8192 }),
    );
    await user.click(screen.getByRole('button', { name: 'acme/Qwen3-8B-GGUF' }));
    await vi.waitFor(() => expect(router.state.location.search).toEqual({ q: 'acme', ctx: 8192 }));
  });

  it('opens a repository the listing does not hold on top of it', async () => {
    renderAt('/registry?repo=other%2FModel-GGUF');
    const detail = await screen.findByRole('region', { name: 'other/Model-GGUF' });
    expect(screen.getByRole('button', { name: 'other/Model-GGUF' })).toHaveAttribute('aria-expanded', 'true');
    expect(detail.closest('tbody')).toHaveClass('pinned');
  });

  it('sits under the mirror, keeps the fetch form’s place in the URL, and lists a fetched set above', async () => {
    const arriving = mirrorVersion('qwen3-8b', 'a1b2c3d-q4_k_m', 'QUEUED');
    const server = { families: [] as unknown[] };
    const { router, fake } = renderAt('/mirror?fetch=true&q=acme&repo=acme%2FQwen3-8B-GGUF', [
      answer(MirrorPage_MirrorQuery, () => ({
        mirror: { ...emptyMirror, ...server, fetching: server.families.length },
      })),
      answer(FileSetRow_FetchMutation, ({ model: m, version: v }) => {
        server.families = [{ __typename: 'MirrorFamily', name: 'qwen', modelCount: 1, versions: [arriving] }];
        return started(m ?? '', v ?? '');
      }),
      answer(FileSetRow_VersionQuery, () => ({ mirrorVersion: arriving })),
    ]);
    const section = await screen.findByRole('region', { name: 'Get from the registry' });
    expect(screen.getByRole('form', { name: 'Fetch by URL' })).toBeVisible();
    const q4 = await within(section).findByTestId('set-model:Qwen3-8B-Q4_K_M');
    const user = userEvent.setup();
    await user.click(within(q4).getByRole('button', { name: 'Fetch' }));

    expect(await within(section).findByRole('status')).toHaveTextContent(
      'started fetching 1 file into qwen3-8b/a1b2c3d-q4_k_m',
    );
    // The mirror above reads its listing again and shows the new version.
    expect(await screen.findByTestId('version-qwen3-8b/a1b2c3d-q4_k_m')).toHaveTextContent('queued');
    expect(fake.sent(MirrorPage_MirrorQuery).length).toBeGreaterThan(1);

    // Closing the fetch form keeps the explorer's state, and the reverse.
    await user.click(screen.getByRole('button', { name: 'Fetch by URL' }));
    await vi.waitFor(() => expect(router.state.location.search).toEqual({ q: 'acme', repo: 'acme/Qwen3-8B-GGUF' }));
    expect(screen.getByRole('region', { name: 'acme/Qwen3-8B-GGUF' })).toBeVisible();
  });

  describe('with the registry turned off on the server (HANGAR_HUB_URL=off)', () => {
    beforeEach(() => {
      registryOn = false;
    });
    afterEach(() => {
      registryOn = true;
    });

    it('has no Registry entry, and the mirror page says nothing of a registry and asks it nothing', async () => {
      const { fake } = renderAt('/mirror');
      expect(await screen.findByRole('heading', { name: 'Mirror', level: 1 })).toBeVisible();
      const nav = screen.getByRole('navigation', { name: 'Main' });
      expect(within(nav).getByRole('link', { name: 'Mirror' })).toBeVisible();
      expect(within(nav).queryByRole('link', { name: 'Registry' })).toBeNull();
      expect(await screen.findByText(/The mirror holds nothing yet/)).not.toHaveTextContent(/registry/i);
      expect(screen.queryByRole('region', { name: 'Get from the registry' })).toBeNull();
      expect(screen.queryByLabelText('Search the registry')).toBeNull();
      expect(fake.sent(RegistryResults_SearchQuery)).toHaveLength(0);
    });

    it('says so on a typed link to /registry, with no search box', async () => {
      const { fake } = renderAt('/registry?q=qwen');
      expect(await screen.findByText('The registry explorer is turned off on this server.')).toBeVisible();
      expect(screen.getByText('HANGAR_HUB_URL=off')).toBeVisible();
      expect(screen.queryByLabelText('Search the registry')).toBeNull();
      expect(fake.sent(RegistryResults_SearchQuery)).toHaveLength(0);
    });
  });

  it('shows the Registry entry when the registry is on', async () => {
    renderAt('/mirror');
    const nav = await screen.findByRole('navigation', { name: 'Main' });
    expect(within(nav).getByRole('link', { name: 'Registry' })).toBeVisible();
    expect(await screen.findByRole('region', { name: 'Get from the registry' })).toBeVisible();
  });

  describe('serving a set in one step', () => {
    const stepNames = ['registry', 'mirror', 'check', 'catalog', 'replica', 'smoke'];
    /** A serve job as the server sends it: the first `done` steps finished, the next running. */
    function job(done: number, over: Record<string, unknown> = {}) {
      return {
        __typename: 'ServeJob',
        id: 'job-1',
        repo: 'acme/Qwen3-8B-GGUF',
        quant: 'Q4_K_M',
        file: null,
        onDemand: true,
        state: done === stepNames.length ? 'DONE' : 'RUNNING',
        message: null,
        createdBy: 'user:ana',
        createdAt: new Date().toISOString(),
        finishedAt: null,
        steps: stepNames.map((name, i) => ({
          __typename: 'ServeJobStep',
          id: `job-1:${name}`,
          name,
          state: i < done ? 'DONE' : i === done ? 'RUNNING' : 'QUEUED',
          message: i < done ? `${name} done` : null,
          startedAt: null,
          finishedAt: null,
        })),
        ...over,
      };
    }

    it('starts a serve job from a GGUF model set and follows its steps live', async () => {
      const fake = fakeClient([
        answer(RegistryResults_SearchQuery, () => page(['acme/Qwen3-8B-GGUF'])),
        answer(RepoDetail_RepoQuery, ({ id }) => repo(id)),
        answer(FileSetRow_ServeMutation, () => ({ serveFromRegistry: job(0) })),
        answer(ServeJob_JobQuery, () => ({ serveJob: job(0) })),
      ]);
      renderExplorer(fake);
      const user = await search('qwen3');
      await user.click(await screen.findByRole('button', { name: 'acme/Qwen3-8B-GGUF' }));
      const row = await setRow('model:Qwen3-8B-Q4_K_M');
      // A projector is no model: it is fetched, never served.
      expect(within(await setRow('mmproj:mmproj-Qwen3-8B-F16')).queryByRole('button', { name: 'Serve' })).toBeNull();

      await user.click(within(row).getByRole('checkbox', { name: 'on demand' }));
      await user.click(within(row).getByRole('button', { name: 'Serve' }));
      expect(fake.sent(FileSetRow_ServeMutation).map((op) => op.variables)).toEqual([
        { repo: 'acme/Qwen3-8B-GGUF', quant: 'Q4_K_M', file: null, onDemand: true },
      ]);

      const panel = await screen.findByTestId('job-job-1');
      const steps = () =>
        within(within(panel).getByRole('list', { name: 'Steps' }))
          .getAllByRole('listitem')
          .map((li) => li.textContent);
      await vi.waitFor(() => expect(steps()[0]).toBe('registryrunning'));
      expect(steps()).toHaveLength(6);
      // The job as it is now is read once (a reload re-attaches the same way), and events follow.
      await vi.waitFor(() => expect(fake.sent(ServeJob_JobQuery)).not.toHaveLength(0));
      await act(() => new Promise((resolve) => setTimeout(resolve, 50)));
      expect(fake.sent(ServeJob_ChangedSubscription)[0]?.variables).toEqual({ id: 'job-1' });

      act(() => fake.push(ServeJob_ChangedSubscription, { serveJobChanged: job(3) }));
      await vi.waitFor(() =>
        expect(steps()).toEqual([
          'registrydoneregistry done',
          'mirrordonemirror done',
          'checkdonecheck done',
          'catalogrunning',
          'replicaqueued',
          'smokequeued',
        ]),
      );
      act(() =>
        fake.push(ServeJob_ChangedSubscription, {
          serveJobChanged: job(6, {
            message: 'answered " Hello" at 12.0 tokens/s',
            finishedAt: new Date().toISOString(),
          }),
        }),
      );
      expect(await within(panel).findByRole('status')).toHaveTextContent('answered " Hello" at 12.0 tokens/s');
      expect(steps()[5]).toBe('smokedonesmoke done');
    });

    it('re-attaches to the job in the URL after a reload', async () => {
      const { fake } = renderAt('/registry?q=acme&repo=acme%2FQwen3-8B-GGUF&job=job-1', [
        answer(ServeJob_JobQuery, () => ({ serveJob: job(4) })),
      ]);
      const panel = await screen.findByTestId('job-job-1');
      expect(await within(panel).findByText('catalog done')).toBeInTheDocument();
      expect(fake.sent(ServeJob_JobQuery)[0]?.variables).toEqual({ id: 'job-1' });
      await vi.waitFor(() => expect(fake.sent(ServeJob_ChangedSubscription)).not.toHaveLength(0));
    });
  });
});
