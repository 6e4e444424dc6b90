import { AutoTokenizer, env } from '@huggingface/transformers';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeFile, type FakeHub, fileSha256, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// transformers.js (@huggingface/transformers, nobody here wrote it) loading a tokenizer from Hangar's mirror with
// `env.remoteHost` set to /hf: it fetches <host>/<repo>/resolve/main/<file> as from the Hub. The tokenizer is a
// tiny word-level one made here (no network for a real one); its ids are what the test checks.

const REPO = 'acme/tiny-word-tokenizer';
const COMMIT = '7a1c0de5'.repeat(5);
const VOCAB = { '[UNK]': 0, hello: 1, hangar: 2, mirror: 3, from: 4, the: 5 };
const file = (path: string, value: unknown): FakeFile => {
  const head = Buffer.from(JSON.stringify(value));
  return { path, head, size: head.length };
};
const FILES = [
  file('tokenizer.json', {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [
      { id: 0, content: '[UNK]', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
    ],
    normalizer: { type: 'Lowercase' },
    pre_tokenizer: { type: 'Whitespace' },
    post_processor: null,
    decoder: null,
    model: { type: 'WordLevel', vocab: VOCAB, unk_token: '[UNK]' },
  }),
  file('tokenizer_config.json', { tokenizer_class: 'PreTrainedTokenizerFast', unk_token: '[UNK]' }),
  file('config.json', { model_type: 'bert' }),
];

let hub: FakeHub;
let t: TestApp;
let base: string;
let token: string;

beforeAll(async () => {
  hub = await startFakeHub();
  hub.repos.set(REPO, { id: REPO, sha: COMMIT, files: FILES });
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  base = await t.app.start();
  token = await t.token('OPERATOR', 'tokenizer-reader');
  const r = await t.gql(
    'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "tiny-word", version: "7a1c0de", sources: $s) { __typename ... on Error { message } } }',
    {
      s: FILES.map((f) => ({
        url: `${hub.url}/${REPO}/resolve/${COMMIT}/${f.path}`,
        file: f.path,
        sha256: fileSha256(f),
      })),
    },
    { token },
  );
  expect(r.data?.fetchToMirror.__typename).toBe('FetchStarted');
  const end = Date.now() + 20_000;
  while ((await t.app.db.prisma.mirrorFile.count({ where: { model: 'tiny-word', state: 'PRESENT' } })) < FILES.length) {
    if (Date.now() > end) throw new Error('the tokenizer did not arrive in the mirror');
    await new Promise((r) => setTimeout(r, 50));
  }
  // Hangar is the only host: nothing local, nothing kept between runs (a cached copy would hide the server).
  env.remoteHost = `${base}/hf/`;
  env.allowLocalModels = false;
  env.useFSCache = false;
  env.useBrowserCache = false;
}, 60_000);
afterAll(async () => {
  await t?.close();
  await hub?.close();
});

describe('transformers.js with env.remoteHost at /hf', () => {
  /** transformers.js sends HF_TOKEN to huggingface.co only: its `env.fetch` hook is how a mirror gets a token. */
  const withToken = (secret: string) => (url: string | URL, init?: RequestInit) => {
    const headers = new Headers(init?.headers);
    headers.set('authorization', `Bearer ${secret}`);
    return fetch(url, { ...init, headers });
  };

  it('loads a tokenizer mirrored into Hangar and encodes with it', async () => {
    const requests: string[] = [];
    const send = withToken(`hf_${token}`);
    env.fetch = (url, init) => {
      requests.push(String(url));
      return send(url, init);
    };
    const tokenizer = await AutoTokenizer.from_pretrained(REPO);
    expect(tokenizer.encode('Hello from the Hangar mirror', { add_special_tokens: false })).toEqual([1, 4, 5, 2, 3]);
    expect(tokenizer.encode('hello nobody', { add_special_tokens: false })).toEqual([1, 0]);
    expect(requests).toContain(`${base}/hf/${REPO}/resolve/main/tokenizer.json`);
  });

  it('fails as it fails on the Hub when the mirror refuses the token or lacks the repository', async () => {
    const answers: [string, number, string | null][] = [];
    const recording = (secret: string) => {
      const send = withToken(secret);
      return async (url: string | URL, init?: RequestInit) => {
        const r = await send(url, init);
        answers.push([String(url).slice(`${base}/hf/`.length), r.status, r.headers.get('x-error-code')]);
        return r;
      };
    };
    env.fetch = recording('hf_hgr_not-a-token');
    await expect(AutoTokenizer.from_pretrained(REPO)).rejects.toThrow(/Unauthorized access to file/);
    expect(answers).toContainEqual([`${REPO}/resolve/main/tokenizer.json`, 401, null]);
    // transformers.js reads a 404 for a whole repository as files not found, and fails on the missing config: the
    // Hub's code tells the repository is what is missing.
    env.fetch = recording(`hf_${token}`);
    await expect(AutoTokenizer.from_pretrained('acme/not-mirrored')).rejects.toThrow();
    expect(answers).toContainEqual(['acme/not-mirrored/resolve/main/tokenizer_config.json', 404, 'RepoNotFound']);
  });
});
