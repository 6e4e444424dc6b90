import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { gguf, modelHeader } from '@hangar/common/test/fixtures/gguf-writer';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';

// The look before a fetch by URL: fetchToMirror reads each GGUF's header over Range and refuses what the nodes'
// llama.cpp cannot load, before a byte of the download moves. The upstream is the fault upstream (the Hub's file
// server, answering Range); the files are real GGUF headers (and the real tiny llama).

let t: TestApp;
let up: Upstream;
let token: string;

const FETCH = `mutation($model: String!, $version: String!, $sources: [MirrorSourceInput!]!, $anyway: Boolean) {
  fetchToMirror(model: $model, version: $version, sources: $sources, fetchAnyway: $anyway) {
    __typename
    ... on FetchStarted { message started }
    ... on UnloadableError { field file reason }
    ... on Error { message }
  }
}`;

const fetchInto = async (model: string, names: string[], anyway?: boolean) =>
  (await t.gql(FETCH, { model, version: 'v1', sources: names.map((n) => ({ url: up.url(n) })), anyway }, { token }))
    .data?.fetchToMirror;
const rows = (model: string) => t.app.db.prisma.mirrorFile.count({ where: { model } });

beforeAll(async () => {
  up = await startUpstream();
  t = await startTestApp({ HANGAR_LLAMACPP_BUILD: '4748', HANGAR_HUB_URL: 'off' });
  await t.app.start();
  token = await t.token('OPERATOR', 'looker');
  // Of an unknown architecture, and of a tensor type llama.cpp has never had: both headers are well-formed.
  up.files.set('wobble-Q4_K_M.gguf', { body: Buffer.concat([modelHeader({ arch: 'wobble' }).header, bytes(4096)]) });
  up.files.set('odd-quant.gguf', { body: modelHeader({ arch: 'llama', tensorType: 99 }).header });
  up.files.set('qwen3-Q4_K_M.gguf', { body: modelHeader({ arch: 'qwen3' }).header });
  // A Git LFS pointer saved under the weights' name: what a wrong "raw" link gives.
  up.files.set('pointer.gguf', {
    body: Buffer.from('version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 4368439296\n'),
  });
  up.files.set('tiny-llama.gguf', { body: tinyLlama() });
  up.files.set('mmproj-F16.gguf', {
    body: gguf([
      ['general.architecture', 'str', 'clip'],
      ['general.type', 'str', 'mmproj'],
    ]).header,
  });
});
afterAll(async () => {
  await t?.close();
  await up?.close();
});
afterEach(() => {
  up.requests.length = 0;
});

describe('a fetch by URL reads the header first', () => {
  it('refuses an architecture the nodes do not know, saying why and how to force it, and records nothing', async () => {
    const r = await fetchInto('wobble', ['wobble-Q4_K_M.gguf']);
    expect(r).toEqual({
      __typename: 'UnloadableError',
      field: 'sources.0.url',
      file: 'wobble-Q4_K_M.gguf',
      reason: expect.stringMatching(/^llama\.cpp \(up to b\d+\) has no architecture named wobble$/),
      message: expect.stringMatching(
        /^not fetched: wobble-Q4_K_M\.gguf: llama\.cpp .* has no architecture named wobble\. .*fetchAnyway: true/,
      ),
    });
    expect(await rows('wobble')).toBe(0);
    // Only the header was asked for, by Range: no download began.
    expect(up.requests.map((q) => q.range)).toEqual(['bytes=0-262143']);
  });

  it('refuses a tensor type llama.cpp does not know, an architecture too new for the nodes, and a file that is no GGUF', async () => {
    expect(await fetchInto('odd', ['odd-quant.gguf'])).toMatchObject({
      __typename: 'UnloadableError',
      reason: expect.stringMatching(/tensor type 99, which llama\.cpp does not know/),
    });
    expect(await fetchInto('qwen', ['qwen3-Q4_K_M.gguf'])).toMatchObject({
      __typename: 'UnloadableError',
      reason: 'qwen3 needs llama.cpp b5092; no node has reported its llama.cpp; assuming b4748',
    });
    expect(await fetchInto('pointer', ['pointer.gguf'])).toMatchObject({
      __typename: 'UnloadableError',
      reason: 'not a GGUF llama.cpp loads: not a GGUF file (its first bytes are not "GGUF")',
    });
    expect(await rows('odd')).toBe(0);
    expect(await rows('qwen')).toBe(0);
    expect(await rows('pointer')).toBe(0);
  });

  it('names the refused source among several', async () => {
    const r = await fetchInto('pair', ['tiny-llama.gguf', 'wobble-Q4_K_M.gguf']);
    expect(r).toMatchObject({ __typename: 'UnloadableError', field: 'sources.1.url', file: 'wobble-Q4_K_M.gguf' });
    expect(await rows('pair')).toBe(0);
  });

  it('fetches what the nodes load, and says what it read', async () => {
    const r = await fetchInto('tiny', ['tiny-llama.gguf', 'mmproj-F16.gguf']);
    expect(r).toMatchObject({ __typename: 'FetchStarted', started: 2 });
    expect(r.message).toMatch(
      /^started fetching 2 files into tiny\/v1 \(tiny-llama\.gguf: llama, .*2 layers: llama loads/,
    );
    expect(r.message).toMatch(/mmproj-F16\.gguf: a vision projector/);
  });

  it('fetches anyway when asked, without reading the header', async () => {
    const r = await fetchInto('wobble-anyway', ['wobble-Q4_K_M.gguf'], true);
    expect(r).toMatchObject({
      __typename: 'FetchStarted',
      started: 1,
      message: 'started fetching 1 file into wobble-anyway/v1',
    });
    expect(await rows('wobble-anyway')).toBe(1);
    // The first request is the download's own (no header read before it).
    expect(up.requests[0]?.range).toBeUndefined();
  });

  it('does not refuse what it could not read: the download meets the same wall and says so', async () => {
    const r = await fetchInto('gone', ['no-such.gguf']);
    expect(r).toMatchObject({
      __typename: 'FetchStarted',
      message: expect.stringMatching(/not checked \(reading the header failed: HTTP 404\)/),
    });
  });
});
