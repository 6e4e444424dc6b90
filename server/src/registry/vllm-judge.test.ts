import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// Safetensors sets judged against the nodes' vLLM, as GGUF sets are against their llama.cpp: the architecture
// config.json names against vLLM's model registry, the memory the weights and one context of cache need, and the
// vLLM node with a card that has it free. Before, every such set was "not servable" and its fetch refused unless
// forced, even with a vLLM node online.

const GB = 1024 ** 3;
let hub: FakeHub;
let t: TestApp;
let token: string;

const qwenConfig = {
  architectures: ['Qwen3ForCausalLM'],
  hidden_size: 1024,
  num_hidden_layers: 28,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 128,
  max_position_embeddings: 40960,
  torch_dtype: 'bfloat16',
};
const json = (v: unknown) => Buffer.from(JSON.stringify(v));

beforeAll(async () => {
  hub = await startFakeHub();
  hub.repos.set('acme/Qwen3-0.6B', {
    id: 'acme/Qwen3-0.6B',
    sha: '0a0a0a0a00000000000000000000000000000000',
    tags: ['safetensors'],
    architecture: 'Qwen3ForCausalLM',
    files: [
      { path: 'config.json', head: json(qwenConfig), size: json(qwenConfig).length },
      { path: 'tokenizer.json', head: json({ version: '1.0' }), size: json({ version: '1.0' }).length },
      { path: 'README.md', head: Buffer.from('# Qwen3 0.6B\n'), size: 13 },
      { path: 'model.safetensors', head: Buffer.from([8, 0, 0, 0, 0, 0, 0, 0, 123, 125]), size: 10, lfs: true },
    ],
  });
  const foreign = { ...qwenConfig, architectures: ['FooBarForCausalLM'] };
  hub.repos.set('acme/FooBar-1B', {
    id: 'acme/FooBar-1B',
    sha: '0b0b0b0b00000000000000000000000000000000',
    tags: ['safetensors'],
    files: [
      { path: 'config.json', head: json(foreign), size: json(foreign).length },
      { path: 'model.safetensors', head: Buffer.alloc(16), size: 2 * GB, lfs: true },
    ],
  });
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  await t.app.start();
  token = await t.token('OPERATOR', 'vllm-explorer');
});

afterAll(async () => {
  await t?.close();
  await hub?.close();
});

const REPO = `query($id: String!) { registryRepo(id: $id) { __typename
  ... on RegistryRepo { sets { id format verdict { servable reason } memory { context weightsBytes kvCacheBytes totalBytes }
    fits { summary nodes { node fits neededMiB reason } } } }
  ... on Error { message } } }`;
const FETCH = `mutation($repo: String!, $set: String!) { fetchRepoSet(repo: $repo, set: $set) { __typename
  ... on FetchStarted { version { model version files { file } } } ... on Error { message } } }`;

async function node(name: string, engines: unknown[], freeMiB: number) {
  await t.app.db.prisma.node.create({
    data: {
      name,
      tokenHash: `hash-${name}`,
      lastSeenAt: new Date(),
      engines: engines as never,
      gpus: [{ index: 0, name: 'L4', totalMiB: 23034, freeMiB }],
    },
  });
}

const setOf = async (id: string) => {
  const r = await t.gql(REPO, { id }, { token });
  return r.data?.registryRepo.sets.find((s: { format: string }) => s.format === 'SAFETENSORS');
};

describe('safetensors sets and vLLM', () => {
  it('says no node reports vLLM (and how to add one) while none does; a llama.cpp node does not count', async () => {
    await node('cpp-1', [{ name: 'llama.cpp', build: 6000 }], 20000);
    const set = await setOf('acme/Qwen3-0.6B');
    expect(set.verdict.servable).toBe(false);
    expect(set.verdict.reason).toMatch(
      /no online node reports vLLM \(install vllm on a node, or set HANGAR_AGENT_VLLM_COMMAND\)/,
    );
  });

  it('judges against a vLLM node: servable architecture, memory from config.json, fit on one card', async () => {
    await node('vllm-1', [{ name: 'vllm' }], 20000);
    await node('vllm-small', [{ name: 'vllm' }], 1000);
    const set = await setOf('acme/Qwen3-0.6B');
    expect(set.verdict).toEqual({ servable: true, reason: 'vLLM serves Qwen3ForCausalLM' });
    // KV: 2 × 28 layers × 8 heads × 128 × context × 2 bytes, at the context Hangar caps to.
    const ctx = set.memory.context;
    expect(set.memory.kvCacheBytes).toBe(2 * 28 * 8 * 128 * ctx * 2);
    expect(set.memory.weightsBytes).toBe(10);
    const fits = Object.fromEntries(set.fits.nodes.map((n: { node: string; fits: boolean }) => [n.node, n.fits]));
    // Only vLLM nodes are judged; the small card cannot hold it.
    expect(fits).toEqual({ 'vllm-1': true, 'vllm-small': false });
    expect(set.fits.summary).toBe('fits on 1 of 2 vLLM nodes');
  });

  it('fetches a servable set without force, with the config and tokenizer vLLM needs beside the weights', async () => {
    const set = await setOf('acme/Qwen3-0.6B');
    const r = await t.gql(FETCH, { repo: 'acme/Qwen3-0.6B', set: set.id }, { token });
    expect(r.data?.fetchRepoSet.__typename, JSON.stringify(r)).toBe('FetchStarted');
    const files = r.data?.fetchRepoSet.version.files.map((f: { file: string }) => f.file).sort();
    expect(files).toEqual(['config.json', 'model.safetensors', 'tokenizer.json']);
  });

  it("refuses an architecture vLLM's registry does not have, naming it, unless forced", async () => {
    const set = await setOf('acme/FooBar-1B');
    expect(set.verdict.servable).toBe(false);
    expect(set.verdict.reason).toMatch(/^vLLM has no text-generation model for FooBarForCausalLM/);
    const r = await t.gql(FETCH, { repo: 'acme/FooBar-1B', set: set.id }, { token });
    expect(r.data?.fetchRepoSet).toMatchObject({ __typename: 'ConflictError' });
    expect(r.data?.fetchRepoSet.message).toMatch(
      /not fetched: vLLM has no text-generation model for FooBarForCausalLM/,
    );
  });
});
