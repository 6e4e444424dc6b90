import fs from 'node:fs/promises';
import { gguf, modelHeader } from '@hangar/common/test/fixtures/gguf-writer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, fileSha256, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

const GB = 1024 ** 3;
let hub: FakeHub;
let t: TestApp;
let token: string;

beforeAll(async () => {
  hub = await startFakeHub();
  const q4 = modelHeader({ arch: 'qwen3', layers: 36, embd: 4096, heads: 32, kvHeads: 8, ctx: 40960 });
  const shard = (no: number) =>
    modelHeader({
      arch: 'qwen3',
      layers: 36,
      embd: 4096,
      heads: 32,
      kvHeads: 8,
      ctx: 40960,
      fileType: 1,
      split: { no, count: 3 },
    });
  const clip = gguf([
    ['general.architecture', 'str', 'clip'],
    ['clip.projector_type', 'str', 'mlp'],
  ]);
  hub.repos.set('acme/Qwen3-8B-GGUF', {
    id: 'acme/Qwen3-8B-GGUF',
    sha: 'a1b2c3d4e5f60718293a4b5c6d7e8f9012345678',
    tags: ['gguf', 'qwen3'],
    architecture: 'Qwen3ForCausalLM',
    downloads: 5000,
    files: [
      {
        path: 'README.md',
        head: Buffer.from(
          '---\nlicense: apache-2.0\n---\n# Qwen3 8B\n\n![chart](./chart.png)\n\n[docs](docs/usage.md)\n\n<script>alert(1)</script>\n',
        ),
        size: 98,
      },
      { path: 'Qwen3-8B-Q4_K_M.gguf', head: q4.header, size: 5 * GB, lfs: true },
      { path: 'Qwen3-8B-Q8_0.gguf', head: q4.header, size: 9 * GB, lfs: true },
      ...[1, 2, 3].map((n) => ({
        path: `F16/Qwen3-8B-F16-0000${n}-of-00003.gguf`,
        head: shard(n - 1).header,
        size: 6 * GB,
        lfs: true,
      })),
      { path: 'mmproj-Qwen3-8B-F16.gguf', head: clip.header, size: 600 * 1024 ** 2, lfs: true },
      { path: 'imatrix.dat', head: Buffer.alloc(16), size: 4 * 1024 ** 2, lfs: true },
      { path: 'config.json', head: Buffer.from('{}'), size: 2 },
    ],
  });
  const tiny = modelHeader({ arch: 'llama', layers: 2, embd: 64, heads: 4, kvHeads: 4, ctx: 2048, tensorType: 0 });
  hub.repos.set('acme/Tiny-GGUF', {
    id: 'acme/Tiny-GGUF',
    sha: 'feedbeef00000000000000000000000000000000',
    tags: ['gguf'],
    downloads: 10,
    files: [{ path: 'tiny-F32.gguf', head: tiny.header, size: tiny.size, lfs: true }],
  });
  hub.repos.set('acme/GPTJ-GGUF', {
    id: 'acme/GPTJ-GGUF',
    sha: 'c0ffee0000000000000000000000000000000000',
    tags: ['gguf'],
    downloads: 3,
    files: [
      { path: 'gptj-6b-Q4_0.gguf', head: modelHeader({ arch: 'gptj', fileType: 2 }).header, size: 3 * GB, lfs: true },
    ],
  });
  hub.repos.set('meta/Gated-GGUF', {
    id: 'meta/Gated-GGUF',
    sha: 'dead000000000000000000000000000000000000',
    gated: 'manual',
    tags: ['gguf'],
    downloads: 1,
    files: [{ path: 'gated-Q4_K_M.gguf', head: q4.header, size: 5 * GB, lfs: true }],
  });
  hub.repos.set('acme/Broken', { id: 'acme/Broken', sha: 'b'.repeat(40), broken: true, files: [] });
  // "imatrix" in the name means "quantised with an importance matrix" here; the header says an 80-layer llama.
  const llama80 = modelHeader({ arch: 'llama', layers: 80, embd: 8192, heads: 64, kvHeads: 8, ctx: 131072 });
  const imatrix = gguf([
    ['general.type', 'str', 'imatrix'],
    ['imatrix.chunk_count', 'u32', 125],
  ]);
  hub.repos.set('acme/Llama-80L-imatrix-GGUF', {
    id: 'acme/Llama-80L-imatrix-GGUF',
    sha: '80a0000000000000000000000000000000000000',
    tags: ['gguf'],
    downloads: 1,
    files: [
      { path: 'Llama-3.3-70B-Instruct-imatrix-Q4_K_M.gguf', head: llama80.header, size: 42 * GB, lfs: true },
      { path: 'calibration.gguf', head: imatrix.header, size: 8 * 1024 ** 2, lfs: true },
    ],
  });
  // Two models in one repository: each set gets its own version, not one for the repository.
  hub.repos.set('acme/Mixed-GGUF', {
    id: 'acme/Mixed-GGUF',
    sha: '7777777000000000000000000000000000000000',
    tags: ['gguf'],
    downloads: 1,
    files: [
      { path: 'tiny-llama-F32.gguf', head: tiny.header, size: 161 * 1024, lfs: true },
      { path: 'qwen-Q4_K_M.gguf', head: q4.header, size: 5 * GB, lfs: true },
      { path: 'a/model-Q8_0.gguf', head: q4.header, size: 9 * GB, lfs: true },
      { path: 'b/model-Q8_0.gguf', head: q4.header, size: 9 * GB, lfs: true },
    ],
  });
  const real = await fs.readFile(
    new URL('../../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url),
  );
  hub.repos.set('ggml-org/Llama-Vocab-GGUF', {
    id: 'ggml-org/Llama-Vocab-GGUF',
    sha: '1234567000000000000000000000000000000000',
    tags: ['gguf'],
    downloads: 2,
    files: [{ path: 'ggml-vocab-llama-spm.gguf', head: real, size: real.length, lfs: true }],
  });

  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_LLAMACPP_BUILD: '10470' });
  await t.app.start();
  token = await t.token('OPERATOR', 'explorer');
  // One node, reporting an old llama.cpp and a 24 GB card with 20 GiB free.
  await t.app.db.prisma.node.create({
    data: {
      name: 'gpu-1',
      tokenHash: 'x',
      lastSeenAt: new Date(),
      engines: [{ name: 'llama.cpp', version: 'b4748', build: 4748 }],
      gpus: [{ index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20480 }],
    },
  });
});
afterAll(async () => {
  await t?.close();
  await hub?.close();
});

const REPO = `query($id: String!, $context: Int) { registryRepo(id: $id, context: $context) {
  __typename
  ... on RegistryRepo { id revision shortRevision gated noAccess architecture cardHtml
    sets { id kind format quant shardCount complete totalBytes model version headerBytesRead headerError
      header { architecture contextLength layers heads kvHeads keyLength fileType parameterCount }
      verdict { servable reason neededBuild }
      memory { context weightsBytes kvCacheBytes overheadBytes totalBytes }
      fits { summary disk { fits } nodes { node fits freeMiB neededMiB reason } } } }
  ... on Error { message }
} }`;

describe('the registry explorer', () => {
  it('searches, with paging', async () => {
    const q =
      'query($after: String) { registrySearch(query: "gguf", first: 2, after: $after) { __typename ... on RegistrySearch { nodes { id downloads hasGguf gated } hasNextPage endCursor } } }';
    const first = await t.gql(q, {}, { token });
    expect(first.data?.registrySearch.nodes).toEqual([
      { id: 'acme/Qwen3-8B-GGUF', downloads: 5000, hasGguf: true, gated: false },
      { id: 'acme/Tiny-GGUF', downloads: 10, hasGguf: true, gated: false },
    ]);
    expect(first.data?.registrySearch.hasNextPage).toBe(true);
    const second = await t.gql(q, { after: first.data?.registrySearch.endCursor }, { token });
    expect(second.data?.registrySearch.nodes.map((n: { id: string }) => n.id)).toEqual([
      'acme/GPTJ-GGUF',
      'ggml-org/Llama-Vocab-GGUF',
    ]);
  });

  it('groups a repository into sets and judges each before any download', async () => {
    hub.bytesServed = 0;
    const r = await t.gql(REPO, { id: 'acme/Qwen3-8B-GGUF' }, { token });
    const repo = r.data?.registryRepo;
    expect(repo).toMatchObject({
      __typename: 'RegistryRepo',
      shortRevision: 'a1b2c3d',
      gated: false,
      noAccess: null,
      architecture: 'Qwen3ForCausalLM',
    });
    const sets = repo.sets as any[];
    expect(sets.map((s) => [s.kind, s.quant, s.shardCount, s.totalBytes, s.version])).toEqual([
      ['MODEL', 'Q4_K_M', 1, 5 * GB, 'a1b2c3d-q4_k_m'],
      ['MODEL', 'Q8_0', 1, 9 * GB, 'a1b2c3d-q8_0'],
      ['MODEL', 'F16', 3, 18 * GB, 'a1b2c3d-f16'],
      ['MMPROJ', 'F16', 1, 600 * 1024 ** 2, 'a1b2c3d-mmproj-f16'],
      ['IMATRIX', null, 1, 4 * 1024 ** 2, 'a1b2c3d-imatrix'],
    ]);
    const q4 = sets[0];
    expect(q4).toMatchObject({ model: 'qwen3-8b', version: 'a1b2c3d-q4_k_m' });
    expect(q4.header).toMatchObject({
      architecture: 'qwen3',
      contextLength: 40960,
      layers: 36,
      heads: 32,
      kvHeads: 8,
      keyLength: 128,
      fileType: 'Q4_K_M',
    });
    expect(q4.verdict).toEqual({
      servable: false,
      reason: 'qwen3 needs llama.cpp b5092; the nodes run b4748',
      neededBuild: 5092,
    });
    // The default context is the model's, capped at HANGAR_MAX_CONTEXT (32768).
    expect(q4.memory.context).toBe(32768);
    expect(q4.memory.kvCacheBytes).toBe(36 * 32768 * (8 * 128 * 2) * 2);
    expect(q4.memory.totalBytes).toBe(5 * GB + q4.memory.kvCacheBytes + q4.memory.overheadBytes);
    expect(q4.fits.nodes[0]).toMatchObject({ node: 'gpu-1', fits: true, freeMiB: 20480 });
    const f16 = sets[2];
    expect(f16.fits.summary).toMatch(/^fits on no node: needs \d+ MiB, the most free is 20480 MiB$/);
    expect(sets[3].verdict).toMatchObject({ servable: false, reason: expect.stringMatching(/mmproj/) });
    // imatrix.dat is llama.cpp's old binary format: its header says it is no GGUF, and that is the verdict.
    expect(sets[4].verdict).toMatchObject({
      servable: false,
      reason: 'the header could not be read: not a GGUF file (its first bytes are not "GGUF")',
    });
    // Judging five sets of 33 GB read a few hundred KB of headers.
    const read = sets.reduce((n, s) => n + s.headerBytesRead, 0);
    expect(read).toBeLessThan(2 * 1024 ** 2);
    // And nothing else was downloaded: the Hub served those headers and the card, no more.
    expect(hub.bytesServed).toBe(read + 98);
  });

  it('renders the card safely, with relative links pointing at the registry and images as their alt text', async () => {
    const r = await t.gql(REPO, { id: 'acme/Qwen3-8B-GGUF' }, { token });
    const html = r.data?.registryRepo.cardHtml as string;
    expect(html).toContain('<h1>Qwen3 8B</h1>');
    expect(html).not.toContain('<script');
    expect(html).not.toContain('license: apache');
    // The card renders where the browser cannot reach the Hub: nothing in it loads from another server.
    expect(html).not.toMatch(/<img|src=/);
    expect(html).toContain('<span class="card-image"');
    expect(html).toContain('[image: chart]</span>');
    expect(html).toContain(
      `href="${hub.url}/acme/Qwen3-8B-GGUF/blob/a1b2c3d4e5f60718293a4b5c6d7e8f9012345678/docs/usage.md"`,
    );
  });

  it('judges every set by its header, never by its name', async () => {
    hub.bytesServed = 0;
    const r = await t.gql(REPO, { id: 'acme/Llama-80L-imatrix-GGUF' }, { token });
    const sets = r.data?.registryRepo.sets as any[];
    expect(sets.map((s) => [s.id, s.kind, s.header?.layers ?? null, s.verdict.servable])).toEqual([
      ['imatrix:Llama-3.3-70B-Instruct-imatrix-Q4_K_M', 'MODEL', 80, true],
      ['model:calibration', 'IMATRIX', null, false],
    ]);
    expect(sets[0].verdict.reason).toMatch(/^llama loads in llama\.cpp b\d+ and later; the nodes run b4748$/);
    expect(sets[0].version).toBe('80a0000-q4_k_m');
    expect(sets[1].verdict.reason).toBe('an importance matrix: input to quantisation, not a model');
    // Both headers were read, and only the headers.
    expect(sets.every((s) => s.headerBytesRead > 0)).toBe(true);
  });

  it('suggests a version per set: a 161 KiB llama and a 5 GiB qwen never share one', async () => {
    const r = await t.gql(REPO, { id: 'acme/Mixed-GGUF' }, { token });
    const sets = r.data?.registryRepo.sets as { id: string; version: string; totalBytes: number }[];
    expect(sets.map((s) => [s.id, s.version])).toEqual([
      ['model:tiny-llama-F32', '7777777-f32'],
      ['model:qwen-Q4_K_M', '7777777-q4_k_m'],
      // The same quantisation twice, in two folders: the file names tell them apart.
      ['model:a/model-Q8_0', '7777777-model-q8_0'],
      ['model:b/model-Q8_0', '7777777-model-q8_0-2'],
    ]);
    expect(new Set(sets.map((s) => s.version)).size).toBe(sets.length);
  });

  it('estimates at a chosen context', async () => {
    const r = await t.gql(REPO, { id: 'acme/Qwen3-8B-GGUF', context: 4096 }, { token });
    expect(r.data?.registryRepo.sets[0].memory).toMatchObject({ context: 4096, kvCacheBytes: 36 * 4096 * 2048 * 2 });
  });

  it('reads a real GGUF from the registry and gives its KV cache', async () => {
    const r = await t.gql(REPO, { id: 'ggml-org/Llama-Vocab-GGUF', context: 4096 }, { token });
    const set = r.data?.registryRepo.sets[0];
    expect(set.header).toMatchObject({
      architecture: 'llama',
      layers: 32,
      heads: 32,
      kvHeads: 32,
      contextLength: 4096,
    });
    expect(set.memory.kvCacheBytes).toBe(2048 * 1024 * 1024);
    expect(set.verdict.servable).toBe(true);
  });

  it('never offers gptj, which llama.cpp never implemented', async () => {
    const r = await t.gql(REPO, { id: 'acme/GPTJ-GGUF' }, { token });
    expect(r.data?.registryRepo.sets[0].verdict).toMatchObject({
      servable: false,
      reason: 'llama.cpp names gptj but never implemented it',
    });
  });

  it('shows a gated repository with the reason, and refuses to fetch it', async () => {
    const r = await t.gql(REPO, { id: 'meta/Gated-GGUF' }, { token });
    expect(r.data?.registryRepo).toMatchObject({
      gated: true,
      noAccess: 'gated: meta/Gated-GGUF needs an access token with access (HANGAR_HUB_TOKEN)',
    });
    const f = await t.gql(
      'mutation { fetchRepoSet(repo: "meta/Gated-GGUF", set: "model:gated-Q4_K_M", force: true) { __typename ... on Error { message } } }',
      {},
      { token },
    );
    expect(f.data?.fetchRepoSet).toMatchObject({
      __typename: 'ForbiddenError',
      message: expect.stringMatching(/^not fetched: gated/),
    });
  });

  it('says so, in its own place, when the registry fails', async () => {
    const r = await t.gql(REPO, { id: 'acme/Broken' }, { token });
    expect(r.data?.registryRepo).toMatchObject({
      __typename: 'UpstreamError',
      message: expect.stringMatching(/^the registry answered HTTP 500/),
    });
    expect(r.data?.registryRepo.message).not.toMatch(/URL:|expand=/);
    const missing = await t.gql(REPO, { id: 'acme/Nothing-Here' }, { token });
    expect(missing.data?.registryRepo).toEqual({
      __typename: 'NotFoundError',
      message: 'the registry has no repository acme/Nothing-Here',
    });
    const bad = await t.gql(REPO, { id: 'not a repo' }, { token });
    expect(bad.data?.registryRepo.__typename).toBe('ValidationError');
  });

  it('refuses a set that cannot be served unless forced, and says how to force', async () => {
    const r = await t.gql(
      'mutation { fetchRepoSet(repo: "acme/GPTJ-GGUF", set: "model:gptj-6b-Q4_0") { __typename ... on Error { message } } }',
      {},
      { token },
    );
    expect(r.data?.fetchRepoSet).toEqual({
      __typename: 'ConflictError',
      message: 'not fetched: llama.cpp names gptj but never implemented it. Fetch it anyway with force: true',
    });
    expect(await t.app.db.prisma.mirrorFile.count({ where: { model: 'gptj-6b' } })).toBe(0);
    const unknown = await t.gql(
      'mutation { fetchRepoSet(repo: "acme/GPTJ-GGUF", set: "model:nope") { __typename ... on ValidationError { field message } } }',
      {},
      { token },
    );
    expect(unknown.data?.fetchRepoSet).toEqual({
      __typename: 'ValidationError',
      field: 'set',
      message: 'set: acme/GPTJ-GGUF has no set model:nope; it has model:gptj-6b-Q4_0',
    });
  });

  it('fetches a servable set through the mirror with the registry sha256 for every file', async () => {
    const r = await t.gql(
      'mutation { fetchRepoSet(repo: "acme/Tiny-GGUF", set: "model:tiny-F32") { __typename ... on FetchStarted { message version { model version } } ... on Error { message } } }',
      {},
      { token },
    );
    expect(r.data?.fetchRepoSet).toEqual({
      __typename: 'FetchStarted',
      // The header's own words: the fixture's tiny llama says it is Q4_K_M (general.file_type 15).
      message: expect.stringMatching(
        /^started fetching 1 file into tiny\/feedbee-f32 \(tiny-F32\.gguf: llama, Q4_K_M, 2 layers: llama loads/,
      ),
      version: { model: 'tiny', version: 'feedbee-f32' },
    });
    const file = hub.repos.get('acme/Tiny-GGUF')!.files[0]!;
    for (let i = 0; i < 200; i++) {
      const row = await t.app.db.prisma.mirrorFile.findFirst({ where: { model: 'tiny' } });
      if (row?.state === 'PRESENT') {
        expect(row).toMatchObject({ expectedSha256: fileSha256(file), actualSha256: fileSha256(file) });
        return;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error('the set never arrived');
  });
});

describe('a slow registry', () => {
  it('is given up on after HANGAR_HUB_TIMEOUT_MS, saying so', async () => {
    hub.repos.set('acme/Slow-GGUF', { id: 'acme/Slow-GGUF', sha: 's'.repeat(40), delayMs: 3000, files: [] });
    const slow = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_HUB_TIMEOUT_MS: '500' });
    const tok = await slow.token('VIEWER');
    // Without the timeout the answer would come (after 3 s) and be a RegistryRepo.
    const r = await slow.gql(
      '{ registryRepo(id: "acme/Slow-GGUF") { __typename ... on Error { message } } }',
      {},
      { token: tok },
    );
    expect(r.data?.registryRepo).toEqual({
      __typename: 'UpstreamError',
      message: 'the registry did not answer in time',
    });
    await slow.close();
  });
});

describe('with no registry', () => {
  it('keeps everything else working', async () => {
    const off = await startTestApp({ HANGAR_HUB_URL: 'http://127.0.0.1:9', HANGAR_HUB_TIMEOUT_MS: '2000' });
    const tok = await off.token('VIEWER');
    const r = await off.gql(
      '{ registrySearch(query: "x") { __typename ... on Error { message } } mirror { present } }',
      {},
      { token: tok },
    );
    expect(r.data?.registrySearch).toMatchObject({
      __typename: 'UpstreamError',
      message: expect.stringMatching(
        /^the registry at 127\.0\.0\.1:9 \(HANGAR_HUB_URL=http:\/\/127\.0\.0\.1:9\) could not be reached: bad port\. /,
      ),
    });
    // What to do about it, for a site without the internet.
    expect(r.data?.registrySearch.message).toContain(
      'point HANGAR_HUB_URL at a mirror of the Hub this server can reach, or set HANGAR_HUB_URL=off to turn the registry explorer off',
    );
    expect(r.data?.mirror).toEqual({ present: 0 });
    await off.close();
  });
});

describe('with the registry turned off (HANGAR_HUB_URL=off)', () => {
  it('answers every registry query with a typed "turned off", sends nothing anywhere, and still looks before a URL fetch', async () => {
    const off = await startTestApp({ HANGAR_HUB_URL: 'off' });
    await off.app.start();
    const tok = await off.token('OPERATOR', 'offline');
    hub.requests.length = 0;
    const r = await off.gql(
      `{ registrySettings { enabled siteUrl }
         registrySearch(query: "x") { __typename ... on Error { message code } }
         registryRepo(id: "acme/Tiny-GGUF") { __typename ... on Error { message } }
         mirror { present } }`,
      {},
      { token: tok },
    );
    expect(r.data?.registrySettings).toEqual({ enabled: false, siteUrl: null });
    expect(r.data?.registrySearch).toEqual({
      __typename: 'RegistryOffError',
      code: 'REGISTRY_OFF',
      message: expect.stringMatching(/^the registry is turned off here \(HANGAR_HUB_URL=off\)/),
    });
    expect(r.data?.registryRepo.__typename).toBe('RegistryOffError');
    expect(r.data?.mirror).toEqual({ present: 0 });
    const f = await off.gql(
      'mutation { fetchRepoSet(repo: "acme/Tiny-GGUF", set: "model:tiny-F32") { __typename } }',
      {},
      { token: tok },
    );
    expect(f.data?.fetchRepoSet.__typename).toBe('RegistryOffError');
    expect(hub.requests).toEqual([]);
    // A URL on the stand-in Hub is just a URL now: its header is read, and a gptj is refused.
    const url = `${hub.url}/acme/GPTJ-GGUF/resolve/main/gptj-6b-Q4_0.gguf`;
    const u = await off.gql(
      'mutation($u: String!) { fetchToMirror(model: "gptj", version: "v1", sources: [{ url: $u }]) { __typename ... on UnloadableError { reason } } }',
      { u: url },
      { token: tok },
    );
    expect(u.data?.fetchToMirror).toEqual({
      __typename: 'UnloadableError',
      reason: 'llama.cpp names gptj but never implemented it',
    });
    await off.close();
  });

  it('is on, with its address, otherwise', async () => {
    const r = await t.gql('{ registrySettings { enabled siteUrl } }', {}, { token });
    expect(r.data?.registrySettings).toEqual({ enabled: true, siteUrl: hub.url });
  });
});
