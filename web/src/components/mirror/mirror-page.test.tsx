import { act, render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { beforeAll, describe, expect, it, vi } from 'vitest';
import { formatAbsolute } from '../../lib/format';
import { answer, fakeClient } from '../../test/fake-client';
import { FetchForm_FetchMutation } from './fetch-form';
import { type MirrorPage_Mirror, placeVersion } from './mirror-listing';
import { MirrorPage, MirrorPage_ChangedSubscription, MirrorPage_MirrorQuery } from './mirror-page';
import { mirrorTotals } from './mirror-table';
import { RemoveVersion_RemoveMutation } from './remove-version';
import {
  VersionRow_PauseMutation,
  VersionRow_ResumeMutation,
  VersionRow_RetryMutation,
  VersionRow_SetModeMutation,
  type VersionRow_Version,
} from './version-row';

// Every row renders one TimeAgo, which formats the exact time once: counting the calls counts the rows rendered.
vi.mock('../../lib/format', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../lib/format')>();
  return { ...real, formatAbsolute: vi.fn(real.formatAbsolute) };
});

const GiB = 1024 ** 3;
const sha = (c: string) => c.repeat(64);

type State = 'QUEUED' | 'FETCHING' | 'VERIFYING' | 'PRESENT' | 'FAILED' | 'CANCELLED';
type Version = ReturnType<typeof version>;

/** A version as the server sends it: one file unless told otherwise. */
function version(model: string, name: string, state: State, over: Record<string, unknown> = {}) {
  const bytesTotal = 'bytesTotal' in over ? (over.bytesTotal as number | null) : 4 * GiB;
  const bytesDone = (over.bytesDone as number | undefined) ?? (state === 'PRESENT' ? (bytesTotal ?? 0) : 0);
  const id = `${model}/${name}`;
  const file: Record<string, unknown> = {
    __typename: 'MirrorFile',
    id: `f-${id}`,
    file: `${model}.gguf`,
    state,
    bytesDone,
    bytesTotal,
    bytesPerSecond: null,
    sha256: state === 'PRESENT' ? sha('a') : null,
    expectedSha256: sha('a'),
    verified: state === 'PRESENT',
    error: null,
    url: state === 'PRESENT' ? `http://hangar.test/mirror/${id}/${model}.gguf` : null,
    sourceUrl: `https://hub.test/${model}/resolve/main/${model}.gguf`,
  };
  return {
    __typename: 'MirrorVersion',
    id,
    model,
    version: name,
    state,
    removed: false,
    fileCount: 1,
    kind: 'MODEL',
    architecture: null,
    files: [file],
    bytesDone,
    bytesTotal,
    percent: bytesTotal ? Math.floor((bytesDone / bytesTotal) * 1000) / 10 : null,
    bytesPerSecond: null,
    etaSeconds: null,
    retry: null,
    error: null,
    verified: state === 'PRESENT',
    url: state === 'PRESENT' ? `http://hangar.test/mirror/${id}/` : null,
    usedBy: [],
    updatedAt: new Date().toISOString(),
    ...over,
  };
}

/** Families as the server forms them: by the letters a model's name starts with, in first-seen order. */
function byFamily(versions: Version[]) {
  const names = [...new Set(versions.map((v) => v.model.match(/^[a-z]+/)?.[0] ?? v.model))];
  return names.map((name) => ({ name, versions: versions.filter((v) => v.model.startsWith(name)) }));
}

/** The listing, with counts and totals that add up, as the server computes them. */
function listing(families: { name: string; versions: Version[] }[]) {
  const all = families.flatMap((f) => f.versions);
  const count = (states: State[]) => all.filter((v) => states.includes(v.state as State)).length;
  return {
    mirror: {
      __typename: 'Mirror',
      baseUrl: 'http://hangar.test/mirror',
      fetching: count(['QUEUED', 'FETCHING', 'VERIFYING']),
      present: count(['PRESENT']),
      failed: count(['FAILED']),
      diskFreeBytes: 500 * GiB,
      bucket: null,
      bucketQuotaBytes: null,
      families: families.map((f) => ({
        __typename: 'MirrorFamily',
        name: f.name,
        modelCount: new Set(f.versions.map((v) => v.model)).size,
        versions: f.versions,
      })),
    },
  };
}

function renderPage(fake: ReturnType<typeof fakeClient>, canChange = true) {
  return render(
    <Provider value={fake.client}>
      <MirrorPage canChange={canChange} />
    </Provider>,
  );
}

const row = (id: string) => screen.findByTestId(`version-${id}`);

/** Each version row in the page, in order, with the family heading above it (the last one before it). */
function familyOfEachRow() {
  const out: [string, string | undefined][] = [];
  let family: string | undefined;
  for (const el of document.querySelectorAll('tr.family, tr[data-testid^="version-"]')) {
    if (el.classList.contains('family')) family = el.querySelector('.family-toggle')?.textContent ?? undefined;
    else out.push([(el as HTMLElement).dataset.testid?.slice('version-'.length) ?? '', family]);
  }
  return out;
}

describe('MirrorPage', () => {
  // The virtualiser scrolls the window to keep the rows in view steady as rows measure; jsdom has no scrolling.
  beforeAll(() => {
    window.scrollTo = () => {};
  });

  it('puts every row under its own family’s heading, a family of one too, ordered by name alone', async () => {
    // As the server lists them: arriving first, so a family of one sits between rows of others.
    const families = [
      {
        name: 'qwen',
        versions: [
          version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB }),
          version('qwen2.5-coder-7b', 'Q8_0', 'PRESENT'),
          version('qwen3-8b', 'Q8_0', 'PRESENT'),
        ],
      },
      { name: 'tiny', versions: [version('tiny-llama', 'v1', 'PRESENT', { bytesTotal: 161 * 1024 })] },
      {
        name: 'mistral',
        versions: [version('mistral-7b', 'Q8_0', 'PRESENT'), version('mistral-7b', 'Q4_K_M', 'PRESENT')],
      },
      { name: 'ops', versions: [version('ops-runbook', 'v1', 'FAILED', { error: 'gone' })] },
    ];
    renderPage(fakeClient([answer(MirrorPage_MirrorQuery, () => listing(families))]));
    await row('tiny-llama/v1');

    expect(screen.getAllByRole('heading').map((h) => h.textContent)).toEqual([
      'Mirror',
      'mistral1 model · 2 versions · 8.0 GiB',
      'ops1 model · 1 version · 0 B1 failed',
      'qwen2 models · 3 versions · 9.0 GiB1 fetching',
      'tiny1 model · 1 version · 161 KiB',
      'Get from the registry',
    ]);
    expect(familyOfEachRow()).toEqual([
      ['mistral-7b/Q4_K_M', 'mistral'],
      ['mistral-7b/Q8_0', 'mistral'],
      ['ops-runbook/v1', 'ops'],
      ['qwen2.5-coder-7b/Q8_0', 'qwen'],
      ['qwen3-8b/Q4_K_M', 'qwen'],
      ['qwen3-8b/Q8_0', 'qwen'],
      ['tiny-llama/v1', 'tiny'],
    ]);

    const facts = screen.getByLabelText('The mirror');
    expect(within(facts).getByText('Fetching').nextSibling).toHaveTextContent('1');
    expect(within(facts).getByText('Present').nextSibling).toHaveTextContent('5');
    expect(facts).toHaveTextContent('Base URLhttp://hangar.test/mirror');
    // On the data dir's disk: what the versions take and the disk's free space.
    expect(within(facts).getByText('Disk').nextSibling).toHaveTextContent('used · 500 GiB free');
  });

  it('on a bucket, says what the mirror holds there and what its quota leaves, not free disk', async () => {
    const families = [{ name: 'tiny', versions: [version('tiny-llama', 'v1', 'PRESENT', { bytesTotal: 3 * GiB })] }];
    const onBucket = () => {
      const l = listing(families);
      return {
        mirror: { ...l.mirror, bucket: 's3://weights/mirror/', bucketQuotaBytes: 500 * GiB, diskFreeBytes: 497 * GiB },
      };
    };
    renderPage(fakeClient([answer(MirrorPage_MirrorQuery, onBucket)]));
    await row('tiny-llama/v1');
    const facts = screen.getByLabelText('The mirror');
    expect(within(facts).queryByText('Disk')).toBeNull();
    expect(within(facts).getByText('Bucket').nextSibling).toHaveTextContent(
      'in bucket s3://weights/mirror/: 3.0 GiB held · 497 GiB left of the 500 GiB quota',
    );
  });

  it('keeps rows where they are while bytes tick and states change, and counts what each family holds', async () => {
    const used = [
      {
        __typename: 'ModelUse',
        name: 'chat',
        mode: 'ALWAYS',
        replicas: 1,
        maxReplicas: 1,
        declared: false,
        adapterOf: null,
      },
    ];
    const a = version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB });
    const b = version('qwen3-8b', 'Q5_K_M', 'FAILED', { error: 'the upstream answered 404' });
    const c = version('qwen3-8b', 'Q8_0', 'PRESENT', { usedBy: used });
    const d = version('llama3.1-8b', 'Q4_K_M', 'PRESENT', { usedBy: used });
    const server = { versions: [a, b, c, d] };
    const fake = fakeClient([answer(MirrorPage_MirrorQuery, () => listing(byFamily(server.versions)))]);
    renderPage(fake);
    await row('qwen3-8b/Q4_K_M');
    const qwen = screen.getByRole('heading', { name: /^qwen/ });
    expect(within(qwen).getByText('1 fetching')).toHaveClass('badge', 'arriving');
    expect(within(qwen).getByText('1 failed')).toHaveClass('badge', 'bad');
    expect(within(qwen).getByText('1 in use')).toHaveClass('badge', 'ok');
    const llama = screen.getByRole('heading', { name: /^llama/ });
    expect(llama).toHaveTextContent('llama1 model · 1 version · 4.0 GiB1 in use');
    const order = ['llama3.1-8b/Q4_K_M', 'qwen3-8b/Q4_K_M', 'qwen3-8b/Q5_K_M', 'qwen3-8b/Q8_0'];
    expect(familyOfEachRow().map(([id]) => id)).toEqual(order);
    await vi.waitFor(() => expect(fake.sent(MirrorPage_ChangedSubscription)).toHaveLength(1));

    // Bytes tick, then the download finishes and the server lists it elsewhere: no row moves.
    act(() => fake.push(MirrorPage_ChangedSubscription, { mirrorChanged: { ...a, bytesDone: 3 * GiB, percent: 75 } }));
    await vi.waitFor(() =>
      expect(within(screen.getByTestId('version-qwen3-8b/Q4_K_M')).getByRole('progressbar')).toHaveAttribute(
        'aria-valuenow',
        '75',
      ),
    );
    expect(familyOfEachRow().map(([id]) => id)).toEqual(order);
    const done = version('qwen3-8b', 'Q4_K_M', 'PRESENT', { usedBy: used });
    server.versions = [b, d, c, done];
    act(() => fake.push(MirrorPage_ChangedSubscription, { mirrorChanged: done }));
    // The heading follows the rows live: nothing fetching now, and two in use.
    await vi.waitFor(() => expect(screen.getByRole('heading', { name: /^qwen/ })).toHaveTextContent('2 in use'));
    expect(screen.getByRole('heading', { name: /^qwen/ })).not.toHaveTextContent('fetching');
    await vi.waitFor(() => expect(fake.sent(MirrorPage_MirrorQuery).length).toBeGreaterThan(1));
    expect(familyOfEachRow().map(([id]) => id)).toEqual(order);
  });

  it('filters by name and state, folds a family away, and says when nothing matches', async () => {
    const used = [
      {
        __typename: 'ModelUse',
        name: 'chat',
        mode: 'ON_DEMAND',
        replicas: 0,
        maxReplicas: 3,
        declared: false,
        adapterOf: null,
      },
    ];
    const versions = [
      version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB }),
      version('qwen2.5-coder-7b', 'Q8_0', 'PRESENT', { usedBy: used }),
      version('qwen3-8b', 'Q8_0', 'FAILED', { error: 'gone' }),
      version('llama3.1-8b', 'Q4_K_M', 'PRESENT'),
      version('tiny-llama', 'v1', 'CANCELLED'),
    ];
    renderPage(fakeClient([answer(MirrorPage_MirrorQuery, () => listing(byFamily(versions)))]));
    const user = userEvent.setup();
    await row('qwen3-8b/Q4_K_M');
    const shown = () => familyOfEachRow().map(([id]) => id);
    // An on-demand model runs none while idle: the row says how many it may run.
    expect(await row('qwen2.5-coder-7b/Q8_0')).toHaveTextContent('used by chat');
    expect(await row('qwen2.5-coder-7b/Q8_0')).toHaveTextContent('up to 3 replicas');

    const name = screen.getByRole('searchbox', { name: 'Name' });
    await user.type(name, 'LLAMA');
    expect(shown()).toEqual(['llama3.1-8b/Q4_K_M', 'tiny-llama/v1']);
    expect(screen.queryByRole('heading', { name: /^qwen/ })).toBeNull();
    await user.clear(name);
    await user.type(name, 'q8');
    expect(shown()).toEqual(['qwen2.5-coder-7b/Q8_0', 'qwen3-8b/Q8_0']);
    // The heading still counts the whole family, and says how much of it is shown.
    expect(screen.getByRole('heading', { name: /^qwen/ })).toHaveTextContent(
      'qwen2 models · 3 versions · 5.0 GiB · 2 shown',
    );
    await user.clear(name);

    const state = screen.getByRole('combobox', { name: 'State' });
    const pick = async (value: string, ids: string[]) => {
      await user.selectOptions(state, value);
      expect(shown()).toEqual(ids);
    };
    await pick('arriving', ['qwen3-8b/Q4_K_M']);
    await pick('failed', ['qwen3-8b/Q8_0']);
    await pick('present', ['llama3.1-8b/Q4_K_M', 'qwen2.5-coder-7b/Q8_0']);
    await pick('cancelled', ['tiny-llama/v1']);
    await pick('in-use', ['qwen2.5-coder-7b/Q8_0']);
    await user.type(name, 'llama');
    expect(shown()).toEqual([]);
    expect(screen.getByText(/No version matches the filter\./)).toBeInTheDocument();
    await user.click(screen.getByRole('button', { name: 'Show every version' }));
    expect(name).toHaveValue('');
    expect(state).toHaveValue('');
    expect(shown()).toHaveLength(5);

    // Folded: the heading stays, with its counts; its rows leave until it is opened again.
    const fold = within(screen.getByRole('heading', { name: /^qwen/ })).getByRole('button', { name: 'qwen' });
    expect(fold).toHaveAttribute('aria-expanded', 'true');
    await user.click(fold);
    expect(fold).toHaveAttribute('aria-expanded', 'false');
    expect(shown()).toEqual(['llama3.1-8b/Q4_K_M', 'tiny-llama/v1']);
    expect(screen.getByRole('heading', { name: /^qwen/ })).toHaveTextContent('1 fetching');
    await user.click(fold);
    expect(shown()).toHaveLength(5);
  });

  it('renders only the rows in view at 5000 versions, and the rows further down once scrolled to', async () => {
    // jsdom lays nothing out: every element measures this tall, the way react-virtual's own tests stand in for
    // layout, so the window's 768 px hold about a dozen rows.
    const height = vi.spyOn(HTMLElement.prototype, 'offsetHeight', 'get').mockReturnValue(60);
    try {
      const versions = Array.from({ length: 5000 }, (_, i) =>
        version(`fam${String(i % 20).padStart(2, '0')}-model-${String(i).padStart(4, '0')}`, 'v1', 'PRESENT'),
      );
      renderPage(fakeClient([answer(MirrorPage_MirrorQuery, () => listing(byFamily(versions)))]));
      // Normalising 5000 versions into graphcache takes jsdom a while.
      await screen.findByTestId('version-fam00-model-0000/v1', {}, { timeout: 30_000 });
      const inDom = () => screen.getAllByTestId(/^version-/);
      expect(inDom().length).toBeGreaterThan(5);
      expect(inDom().length).toBeLessThan(40);
      expect(screen.queryByTestId('version-fam19-model-4999/v1')).toBeNull();
      // The table is as tall as every row would make it, each rendered row group placed where its row starts.
      const table = document.querySelector('table.mirror') as HTMLElement;
      expect(Number.parseInt(table.style.height, 10)).toBeGreaterThan(5000 * 50);
      const placed = [...table.querySelectorAll<HTMLElement>(':scope > tbody')].map((b) =>
        Number(/translateY\((\d+)px\)/.exec(b.style.transform)?.[1]),
      );
      expect(placed[0]).toBe(60);
      for (let i = 1; i < placed.length; i++) expect(placed[i]).toBeGreaterThan(placed[i - 1] as number);

      // Scrolled to the end: the last family's last rows are there, the first ones gone.
      // Past the end of the rows as estimated before they are measured (100 px a row).
      Object.defineProperty(window, 'scrollY', { configurable: true, value: 5020 * 100 });
      act(() => {
        window.dispatchEvent(new Event('scroll'));
      });
      expect(await row('fam19-model-4999/v1')).toBeInTheDocument();
      expect(screen.queryByTestId('version-fam00-model-0000/v1')).toBeNull();
      expect(inDom().length).toBeLessThan(40);
    } finally {
      height.mockRestore();
      Object.defineProperty(window, 'scrollY', { configurable: true, value: 0 });
    }
  }, 60_000);

  it('shows the bytes so far, and no bar, while the total is unknown; a bar only with a percentage', async () => {
    const families = [
      {
        name: 'qwen',
        versions: [
          version('qwen3-8b', 'Q4_K_M', 'FETCHING', {
            bytesTotal: null,
            bytesDone: 1.5 * GiB,
            bytesPerSecond: 50 * 1024 ** 2,
          }),
          version('qwen3-8b', 'Q8_0', 'FETCHING', {
            bytesDone: 2 * GiB,
            bytesPerSecond: 100 * 1024 ** 2,
            etaSeconds: 20,
          }),
        ],
      },
    ];
    renderPage(fakeClient([answer(MirrorPage_MirrorQuery, () => listing(families))]));

    const unknown = await row('qwen3-8b/Q4_K_M');
    expect(unknown).toHaveTextContent('1.5 GiB so far');
    expect(unknown).toHaveTextContent('50 MiB/s');
    expect(within(unknown).queryByRole('progressbar')).toBeNull();
    expect(unknown).not.toHaveTextContent('%');

    const known = await row('qwen3-8b/Q8_0');
    const bar = within(known).getByRole('progressbar', { name: 'qwen3-8b/Q8_0 progress' });
    expect(bar).toHaveAttribute('aria-valuenow', '50');
    expect(known).toHaveTextContent('2.0 GiB of 4.0 GiB');
    expect(known).toHaveTextContent('100 MiB/s · about 20 s left');
  });

  it('says "retrying" with the attempt, the countdown and the reason while the upstream is out of reach', async () => {
    const reason = 'could not reach the upstream (ECONNREFUSED)';
    const waiting = version('qwen3-8b', 'Q4_K_M', 'FETCHING', {
      bytesDone: GiB,
      bytesPerSecond: 0,
      etaSeconds: null,
      retry: { __typename: 'MirrorRetry', attempt: 3, nextAt: new Date(Date.now() + 20_500).toISOString(), reason },
    });
    renderPage(fakeClient([answer(MirrorPage_MirrorQuery, () => listing([{ name: 'qwen', versions: [waiting] }]))]));
    const r = await row('qwen3-8b/Q4_K_M');
    expect(within(r).getByTestId('retrying')).toHaveTextContent(`retrying (attempt 3, next in 20 s): ${reason}`);
    expect(r).not.toHaveTextContent('left');
    expect(r).not.toHaveTextContent('/s');
  });

  it('pauses a download keeping what arrived, and resumes it', async () => {
    const fetching = version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB, bytesPerSecond: GiB });
    const paused = { ...fetching, state: 'PAUSED', bytesPerSecond: null };
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing([{ name: 'qwen', versions: [fetching] }])),
      answer(VersionRow_PauseMutation, () => ({ pauseMirrorFetch: paused })),
      answer(VersionRow_ResumeMutation, () => ({ resumeMirrorFetch: { ...fetching, state: 'QUEUED' } })),
    ]);
    renderPage(fake);
    const r = await row('qwen3-8b/Q4_K_M');
    const user = userEvent.setup();
    await user.click(within(r).getByRole('button', { name: 'Pause' }));
    expect(await within(r).findByText('paused')).toHaveClass('badge');
    expect(r).toHaveTextContent('1.0 GiB kept');
    await user.click(within(r).getByRole('button', { name: 'Resume' }));
    expect(await within(r).findByText('queued')).toBeInTheDocument();
    expect(fake.sent(VersionRow_PauseMutation)[0]?.variables).toEqual({ model: 'qwen3-8b', version: 'Q4_K_M' });
    expect(fake.sent(VersionRow_ResumeMutation)).toHaveLength(1);
  });

  it('says why a failed version failed and retries it in place', async () => {
    const error = 'the upstream has no such file (HTTP 404)';
    const failed = version('qwen3-8b', 'Q4_K_M', 'FAILED', { error });
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing([{ name: 'qwen', versions: [failed] }])),
      answer(VersionRow_RetryMutation, () => ({ retryMirrorFetch: { ...failed, state: 'QUEUED', error: null } })),
    ]);
    renderPage(fake);

    const r = await row('qwen3-8b/Q4_K_M');
    expect(within(r).getByText(error)).toBeInTheDocument();
    expect(within(r).getByText('failed')).toHaveClass('badge', 'bad');
    expect(within(r).queryByRole('button', { name: 'Cancel' })).toBeNull();

    await userEvent.setup().click(within(r).getByRole('button', { name: 'Retry' }));

    expect(await within(r).findByText('queued')).toBeInTheDocument();
    expect(within(r).queryByText(error)).toBeNull();
    expect(within(r).queryByRole('button', { name: 'Retry' })).toBeNull();
    expect(within(r).getByRole('button', { name: 'Cancel' })).toBeInTheDocument();
    expect(fake.sent(VersionRow_RetryMutation)[0]?.variables).toEqual({ model: 'qwen3-8b', version: 'Q4_K_M' });
  });

  it('follows the subscription: bytes tick in place, a new version appears, a removed one leaves', async () => {
    const fetching = version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB, bytesPerSecond: GiB });
    const held = version('qwen3-8b', 'Q8_0', 'PRESENT');
    const server = { versions: [fetching, held] };
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing([{ name: 'qwen', versions: server.versions }])),
    ]);
    renderPage(fake);
    const r = await row('qwen3-8b/Q4_K_M');
    expect(within(r).getByRole('progressbar')).toHaveAttribute('aria-valuenow', '25');
    await vi.waitFor(() => expect(fake.sent(MirrorPage_ChangedSubscription)).toHaveLength(1));
    const reads = fake.sent(MirrorPage_MirrorQuery).length;

    act(() =>
      fake.push(MirrorPage_ChangedSubscription, { mirrorChanged: { ...fetching, bytesDone: 3 * GiB, percent: 75 } }),
    );
    await vi.waitFor(() => expect(within(r).getByRole('progressbar')).toHaveAttribute('aria-valuenow', '75'));
    expect(r).toHaveTextContent('3.0 GiB of 4.0 GiB');
    // Updated where it stands: no reload, and the same row element.
    expect(screen.getByTestId('version-qwen3-8b/Q4_K_M')).toBe(r);
    expect(fake.sent(MirrorPage_MirrorQuery)).toHaveLength(reads);

    // A version fetched elsewhere: the listing is read again and it joins its family.
    const arriving = version('qwen3-14b', 'Q4_K_M', 'QUEUED');
    server.versions = [fetching, arriving, held];
    act(() => fake.push(MirrorPage_ChangedSubscription, { mirrorChanged: arriving }));
    expect(await row('qwen3-14b/Q4_K_M')).toHaveTextContent('queued');
    expect(fake.sent(MirrorPage_MirrorQuery).length).toBeGreaterThan(reads);

    // Removed: the last event says so and the row leaves at once.
    const tombstone = { ...held, state: 'CANCELLED', removed: true, files: [], fileCount: 0, bytesDone: 0, url: null };
    server.versions = [fetching, arriving];
    const readsBefore = fake.sent(MirrorPage_MirrorQuery).length;
    act(() => fake.push(MirrorPage_ChangedSubscription, { mirrorChanged: tombstone }));
    await vi.waitFor(() => expect(screen.queryByTestId('version-qwen3-8b/Q8_0')).toBeNull(), { interval: 20 });
    // Gone on the event itself, before the listing is read again for the counts.
    expect(fake.sent(MirrorPage_MirrorQuery)).toHaveLength(readsBefore);
    await vi.waitFor(() => expect(fake.sent(MirrorPage_MirrorQuery)).toHaveLength(readsBefore + 1));
    expect(screen.getByTestId('version-qwen3-8b/Q4_K_M')).toBeInTheDocument();
  });

  it('keeps the listing out of graphcache, and an event replaces only its own version', async () => {
    const fetching = version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB });
    const others = [version('llama3.1-8b', 'Q4_K_M', 'PRESENT'), version('qwen3-8b', 'Q8_0', 'PRESENT')];
    const fake = fakeClient([answer(MirrorPage_MirrorQuery, () => listing(byFamily([fetching, ...others])))]);
    renderPage(fake);
    await row('qwen3-8b/Q4_K_M');
    // Normalising thousands of versions was most of the page's first load and of every event: none of it is cached.
    expect(fake.client.readQuery(MirrorPage_MirrorQuery, {})?.data ?? null).toBeNull();

    const mirror = listing(byFamily([fetching, ...others])).mirror as unknown as MirrorPage_Mirror;
    const [qwen, llama] = mirror.families;
    const changed = { ...(qwen?.versions[0] as VersionRow_Version), bytesDone: 2 * GiB };
    const next = placeVersion(mirror, changed);
    expect(next?.families[0]?.versions).toEqual([changed, qwen?.versions[1]]);
    // The other family and the other row keep their objects, so their memoised rows are not rendered again.
    expect(next?.families[1]).toBe(llama);
    expect(next?.families[0]?.versions[1]).toBe(qwen?.versions[1]);
    expect(placeVersion(mirror, { ...changed, id: 'new/one' })).toBeNull();
  });

  it('renders again only the row an event is about, not the others in view', async () => {
    const fetching = version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB });
    const others = Array.from({ length: 6 }, (_, i) => version(`qwen3-${i}b`, 'Q8_0', 'PRESENT'));
    const fake = fakeClient([answer(MirrorPage_MirrorQuery, () => listing(byFamily([fetching, ...others])))]);
    renderPage(fake);
    const r = await row('qwen3-8b/Q4_K_M');
    await row('qwen3-5b/Q8_0');
    await vi.waitFor(() => expect(fake.sent(MirrorPage_ChangedSubscription)).toHaveLength(1));
    const rendered = vi.mocked(formatAbsolute);
    rendered.mockClear();

    act(() =>
      fake.push(MirrorPage_ChangedSubscription, { mirrorChanged: { ...fetching, bytesDone: 2 * GiB, percent: 50 } }),
    );
    await vi.waitFor(() => expect(within(r).getByRole('progressbar')).toHaveAttribute('aria-valuenow', '50'));
    // At 5000 versions each row rendered again was work the event did not need: its own row, once.
    expect(rendered).toHaveBeenCalledTimes(1);
  });

  it('adds up what the listing holds by family, a file several versions share once, and follows an event', () => {
    const held = version('qwen3-8b', 'Q8_0', 'PRESENT');
    // The same file (its sha256) in another family's version: a hard link to one copy on disk.
    const linked = version('llama3.1-8b', 'Q8_0', 'PRESENT');
    const fetching = version('qwen3-8b', 'Q4_K_M', 'FETCHING', { bytesDone: GiB });
    fetching.files = [{ ...fetching.files[0], state: 'FETCHING', bytesDone: GiB }];
    const mirror = listing(byFamily([held, fetching, linked])).mirror as unknown as MirrorPage_Mirror;
    expect(mirrorTotals(mirror.families)).toEqual({
      removed: 0,
      arriving: 1,
      present: 2,
      failed: 0,
      arrivingNames: ['qwen3-8b/Q4_K_M'],
      usedBytes: 4 * GiB + GiB,
    });

    const ticked = placeVersion(mirror, {
      ...(fetching as unknown as VersionRow_Version),
      bytesDone: 3 * GiB,
      files: [{ ...(fetching.files[0] as VersionRow_Version['files'][number]), bytesDone: 3 * GiB }],
    });
    expect(mirrorTotals(ticked?.families ?? []).usedBytes).toBe(4 * GiB + 3 * GiB);
    // One of the two links removed: the copy stays on disk for the other.
    const removed = placeVersion(ticked as MirrorPage_Mirror, {
      ...(held as unknown as VersionRow_Version),
      removed: true,
    });
    expect(mirrorTotals(removed?.families ?? [])).toMatchObject({
      removed: 1,
      present: 1,
      usedBytes: 4 * GiB + 3 * GiB,
    });
  });

  it('opens the fetch form on an empty mirror and shows a refusal next to the field it names', async () => {
    const message = 'sources.1.sha256: a sha256 is 64 hexadecimal characters';
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing([])),
      answer(FetchForm_FetchMutation, () => ({
        fetchToMirror: { __typename: 'ValidationError', code: 'VALIDATION', field: 'sources.1.sha256', message },
      })),
    ]);
    renderPage(fake);
    const user = userEvent.setup();

    expect(await screen.findByText(/The mirror holds nothing yet\./)).toBeInTheDocument();
    const form = screen.getByRole('form', { name: 'Fetch by URL' });
    await user.type(within(form).getByLabelText('Model'), 'qwen3-8b');
    await user.type(within(form).getByLabelText('Version'), 'Q4_K_M');
    await user.type(within(form).getByLabelText('Source URL'), 'https://hub.test/a.gguf');
    await user.click(within(form).getByRole('button', { name: 'Add another file' }));
    await user.click(within(form).getByRole('button', { name: 'Add another file' }));
    // The second line stays empty and is not sent: the server's "sources.1" is the third line.
    const urls = within(form).getAllByLabelText('Source URL');
    const shas = within(form).getAllByLabelText('sha256');
    await user.type(urls[2] as HTMLElement, 'https://hub.test/b.gguf');
    await user.type(shas[2] as HTMLElement, 'abc');
    await user.click(within(form).getByRole('button', { name: 'Start fetching' }));

    await vi.waitFor(() => expect(shas[2]).toHaveAttribute('aria-invalid', 'true'));
    // At the field it names, in words: the GraphQL path the server's message starts with is for scripts.
    expect(shas[2]).toHaveAccessibleDescription('a sha256 is 64 hexadecimal characters');
    expect(screen.getByRole('alert')).toHaveTextContent('a sha256 is 64 hexadecimal characters');
    expect(screen.getByRole('alert')).not.toHaveTextContent('sources.1');
    for (const other of [...urls, shas[0], shas[1]]) expect(other).not.toHaveAttribute('aria-invalid');
    expect(fake.sent(FetchForm_FetchMutation)[0]?.variables).toEqual({
      model: 'qwen3-8b',
      version: 'Q4_K_M',
      sources: [
        { url: 'https://hub.test/a.gguf', file: null, sha256: null },
        { url: 'https://hub.test/b.gguf', file: null, sha256: 'abc' },
      ],
      force: false,
      fetchAnyway: false,
    });
  });

  it('answers a fetch with the server’s message and lists the new version', async () => {
    const server = { versions: [version('llama3.1-8b', 'Q4_K_M', 'PRESENT')] };
    const arriving = version('qwen3-8b', 'Q4_K_M', 'QUEUED', { bytesTotal: null });
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing(byFamily(server.versions))),
      answer(FetchForm_FetchMutation, () => {
        server.versions = [arriving, ...server.versions];
        return {
          fetchToMirror: {
            __typename: 'FetchStarted',
            message: 'started fetching 1 file into qwen3-8b/Q4_K_M',
            started: 1,
            alreadyArriving: 0,
            alreadyPresent: 0,
            version: arriving,
          },
        };
      }),
    ]);
    renderPage(fake);
    const user = userEvent.setup();
    await row('llama3.1-8b/Q4_K_M');
    expect(screen.queryByRole('form', { name: 'Fetch by URL' })).toBeNull();

    await user.click(screen.getByRole('button', { name: 'Fetch by URL' }));
    const form = screen.getByRole('form', { name: 'Fetch by URL' });
    await user.type(within(form).getByLabelText('Model'), 'qwen3-8b');
    await user.type(within(form).getByLabelText('Version'), 'Q4_K_M');
    await user.type(within(form).getByLabelText('Source URL'), 'https://hub.test/qwen3-8b.gguf');
    await user.click(within(form).getByRole('button', { name: 'Start fetching' }));

    expect(await screen.findByRole('status')).toHaveTextContent('started fetching 1 file into qwen3-8b/Q4_K_M');
    expect(await row('qwen3-8b/Q4_K_M')).toHaveTextContent('queued');
    expect(within(form).getByLabelText('Model')).toHaveValue('');
  });

  it('asks before removing, shows why the server refused, and removes anyway when told', async () => {
    const used = version('qwen3-8b', 'abc1234', 'PRESENT', {
      bytesTotal: 4.7 * GiB,
      usedBy: [
        {
          __typename: 'ModelUse',
          name: 'plain-model',
          mode: 'ALWAYS',
          replicas: 1,
          maxReplicas: 1,
          declared: false,
          adapterOf: null,
        },
      ],
    });
    const refusal =
      'qwen3-8b/abc1234 is the source of plain-model: change or remove those models first, or remove it with force (their replicas will fail to load)';
    const server = { versions: [used] };
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing([{ name: 'qwen', versions: server.versions }])),
      answer(RemoveVersion_RemoveMutation, ({ force }) => {
        if (!force) return { removeMirrorVersion: { __typename: 'ConflictError', code: 'CONFLICT', message: refusal } };
        server.versions = [];
        return {
          removeMirrorVersion: {
            __typename: 'RemovedMirrorVersion',
            id: used.id,
            model: used.model,
            version: used.version,
            files: 1,
            bytes: used.bytesDone,
          },
        };
      }),
    ]);
    renderPage(fake);
    const user = userEvent.setup();
    const r = await row('qwen3-8b/abc1234');
    expect(r).toHaveTextContent('used by plain-model');
    expect(within(r).getByRole('combobox', { name: 'Mode of plain-model' })).toHaveValue('ALWAYS');

    await user.click(within(r).getByRole('button', { name: 'Remove' }));
    const dialog = screen.getByRole('alertdialog', { name: 'Remove qwen3-8b/abc1234 (4.7 GiB)?' });
    expect(within(dialog).getByRole('button', { name: 'Keep it' })).toHaveFocus();
    await user.click(within(dialog).getByRole('button', { name: 'Remove' }));

    expect(await within(dialog).findByRole('alert')).toHaveTextContent(refusal);
    expect(screen.getByTestId('version-qwen3-8b/abc1234')).toBeInTheDocument();
    await user.click(within(dialog).getByRole('button', { name: 'Remove anyway' }));

    await vi.waitFor(() => expect(screen.queryByTestId('version-qwen3-8b/abc1234')).toBeNull());
    expect(screen.queryByRole('alertdialog')).toBeNull();
    // The counts are the server's: read again once the rows no longer add up to them.
    await vi.waitFor(() => expect(screen.getByText('Present').nextSibling).toHaveTextContent('0'));
    expect(await screen.findByText(/The mirror holds nothing yet\./)).toBeInTheDocument();
    expect(fake.sent(RemoveVersion_RemoveMutation).map((op) => op.variables)).toEqual([
      { model: 'qwen3-8b', version: 'abc1234', force: false },
      { model: 'qwen3-8b', version: 'abc1234', force: true },
    ]);
  });

  it('changes how a model using the version runs, where the file is seen, and shows a refusal there', async () => {
    const used = version('qwen3-8b', 'abc1234', 'PRESENT', {
      usedBy: [
        {
          __typename: 'ModelUse',
          name: 'plain-model',
          mode: 'ALWAYS',
          replicas: 1,
          maxReplicas: 1,
          declared: false,
          adapterOf: null,
        },
        {
          __typename: 'ModelUse',
          name: 'declared-model',
          mode: 'ON_DEMAND',
          replicas: 0,
          maxReplicas: 2,
          declared: true,
          adapterOf: null,
        },
      ],
    });
    const fake = fakeClient([
      answer(MirrorPage_MirrorQuery, () => listing([{ name: 'qwen', versions: [used] }])),
      answer(VersionRow_SetModeMutation, ({ mode, replicas }) =>
        mode === 'STOPPED'
          ? {
              setModelMode: {
                __typename: 'Model',
                id: 'm1',
                mode: 'STOPPED',
                modeMessage: 'stopped; its replicas are being taken down (1 still running)',
              },
            }
          : mode === 'ALWAYS'
            ? {
                setModelMode: {
                  __typename: 'Model',
                  id: 'm1',
                  mode: 'ALWAYS',
                  modeMessage: `always: ${replicas} replicas are being placed (1 ready)`,
                },
              }
            : {
                setModelMode: {
                  __typename: 'ConflictError',
                  code: 'CONFLICT',
                  message: 'plain-model cannot do that now',
                },
              },
      ),
    ]);
    renderPage(fake);
    const user = userEvent.setup();
    const r = await row('qwen3-8b/abc1234');
    // A declared model is shown, not offered for change: hangar.yaml decides how it runs.
    expect(within(r).queryByRole('combobox', { name: 'Mode of declared-model' })).toBeNull();
    expect(r).toHaveTextContent('used by declared-model (on demand) · up to 2 replicas');
    // An always-on model's replica count, set where the file is seen (the seed's form did), and what the change
    // means said back in the server's words.
    const count = within(r).getByRole('spinbutton', { name: 'Replicas of plain-model' });
    await user.clear(count);
    await user.type(count, '3{Enter}');
    expect(await within(r).findByRole('status')).toHaveTextContent(
      'plain-model: always: 3 replicas are being placed (1 ready)',
    );
    await user.selectOptions(within(r).getByRole('combobox', { name: 'Mode of plain-model' }), 'STOPPED');
    expect(await within(r).findByRole('status')).toHaveTextContent(
      'plain-model: stopped; its replicas are being taken down',
    );
    await user.selectOptions(within(r).getByRole('combobox', { name: 'Mode of plain-model' }), 'ON_DEMAND');
    expect(await within(r).findByRole('alert')).toHaveTextContent('plain-model cannot do that now');
    expect(fake.sent(VersionRow_SetModeMutation).map((op) => op.variables)).toEqual([
      { name: 'plain-model', mode: 'ALWAYS', replicas: 3 },
      { name: 'plain-model', mode: 'STOPPED' },
      { name: 'plain-model', mode: 'ON_DEMAND' },
    ]);
  });

  it('lists a version’s files with size, state, short sha256 and whether it was verified', async () => {
    const unverified = {
      ...version('qwen3-8b', 'Q4_K_M', 'PRESENT').files[0],
      id: 'f2',
      file: 'mmproj.gguf',
      sha256: sha('b'),
      expectedSha256: null,
      verified: false,
      bytesTotal: 600 * 1024 ** 2,
    };
    const v = version('qwen3-8b', 'Q4_K_M', 'PRESENT', { verified: false, fileCount: 2 });
    v.files = [...v.files, unverified];
    renderPage(fakeClient([answer(MirrorPage_MirrorQuery, () => listing([{ name: 'qwen', versions: [v] }]))]));
    const r = await row('qwen3-8b/Q4_K_M');
    expect(within(r).getByText('unverified')).toBeInTheDocument();
    expect(screen.queryByRole('table', { name: 'Files of qwen3-8b/Q4_K_M' })).toBeNull();

    await userEvent.setup().click(within(r).getByRole('button', { name: '2 files' }));

    const files = screen.getByRole('table', { name: 'Files of qwen3-8b/Q4_K_M' });
    const first = within(files)
      .getByRole('rowheader', { name: /^qwen3-8b\.gguf/ })
      .closest('tr') as HTMLElement;
    expect(first).toHaveTextContent('4.0 GiB');
    expect(within(first).getByText('aaaaaaaaaaaa…')).toHaveAttribute('title', sha('a'));
    expect(within(first).getByText('verified')).toHaveClass('badge', 'ok');
    const second = within(files)
      .getByRole('rowheader', { name: /^mmproj\.gguf/ })
      .closest('tr') as HTMLElement;
    expect(second).toHaveTextContent('600 MiB');
    expect(within(second).getByText('unverified')).toBeInTheDocument();
  });

  it('offers a viewer no buttons that change the mirror', async () => {
    const families = [{ name: 'qwen', versions: [version('qwen3-8b', 'Q4_K_M', 'FAILED', { error: 'gone' })] }];
    renderPage(fakeClient([answer(MirrorPage_MirrorQuery, () => listing(families))]), false);
    const r = await row('qwen3-8b/Q4_K_M');
    expect(within(r).getByRole('button', { name: '1 file' })).toBeInTheDocument();
    expect(within(r).queryByRole('button', { name: /Retry|Remove|Cancel/ })).toBeNull();
    expect(screen.queryByRole('button', { name: 'Fetch by URL' })).toBeNull();
  });

  it('offers no Serve on an adapter: it shows the models it belongs to, or how it gets one', async () => {
    const attached = version('support-tone', 'job-1', 'PRESENT', {
      kind: 'ADAPTER',
      architecture: 'llama',
      usedBy: [
        {
          __typename: 'ModelUse',
          name: 'support-tone',
          mode: 'ALWAYS',
          replicas: 1,
          maxReplicas: 1,
          declared: false,
          adapterOf: 'llama-chat',
        },
      ],
    });
    const loose = version('stray-lora', 'job-2', 'PRESENT', { kind: 'ADAPTER', architecture: 'qwen2' });
    const weights = version('llama-chat', 'Q4_K_M', 'PRESENT', { kind: 'MODEL', architecture: 'llama' });
    renderPage(
      fakeClient([
        answer(MirrorPage_MirrorQuery, () =>
          listing([
            { name: 'llama', versions: [weights] },
            { name: 'stray', versions: [loose] },
            { name: 'support', versions: [attached] },
          ]),
        ),
      ]),
    );
    const a = await row('support-tone/job-1');
    expect(within(a).queryByRole('button', { name: 'Serve' })).toBeNull();
    expect(within(a).getByTestId('adapter-of')).toHaveTextContent('adapter of llama-chat');
    expect(within(within(a).getByTestId('adapter-of')).getByRole('link', { name: 'llama-chat' })).toHaveAttribute(
      'href',
      '/models/llama-chat',
    );
    // Its "used by" chip is the adapter's, on its model: no mode of its own to change.
    expect(within(a).getByRole('list', { name: 'Catalog models using support-tone/job-1' })).toHaveTextContent(
      'adapter support-tone of llama-chat (always)',
    );
    expect(within(a).queryByRole('combobox')).toBeNull();
    const b = await row('stray-lora/job-2');
    expect(within(b).queryByRole('button', { name: 'Serve' })).toBeNull();
    expect(within(b).getByTestId('adapter-of')).toHaveTextContent('a LoRA adapter for qwen2: publish it to a model');
    expect(within(await row('llama-chat/Q4_K_M')).getByRole('button', { name: 'Serve' })).toBeInTheDocument();
  });
});
