import { fork } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { newEngineKey } from '@hangar/agent/control-plane';
import { LlamaRuntime } from '@hangar/agent/llama-runtime';
import type { GenerateInput } from '@hangar/agent/openai/engine';
import { createOpenAiServer } from '@hangar/agent/openai/http';
import { LlamaServedModel } from '@hangar/agent/openai/llama-model';
import { createLogger } from '@hangar/common/log';
import { writeTinyLlama } from '@hangar/common/test/fixtures/tiny-llama';

// What a node's HTTP layer costs: tokens per second of the tiny llama through the agent's endpoint (the
// official `openai` client, streaming, over a real socket, from a process of its own) against the same served
// model called in-process, side by side, one client and eight at once. Rounds alternate which goes first; the first round is not
// counted. Goal: ≥ 0.95× (the endpoint must cost next to nothing beside generation).

const ROUNDS = Number(process.argv[2] ?? 5);
const MAX_TOKENS = 64;
const PARALLEL = 8;
const PROMPT = 'The quick brown fox jumps over the lazy dog';

const tiny = await writeTinyLlama();
const runtime = await LlamaRuntime.create();
const loaded = await runtime.load(tiny.file, { contextSize: 256, parallel: PARALLEL });
const served = new LlamaServedModel('tiny', loaded, { parallel: PARALLEL, queueLimit: PARALLEL });
const http = createOpenAiServer({ log: createLogger('warn') });
const key = newEngineKey();
http.serve(served, key);
const url = await http.listen({ host: '127.0.0.1', port: 0 });
// The client is another process, as an application is: on a thread of this one it shared the process's heap,
// its collector and its allocator with the endpoint it measured.
const client = fork(new URL('./serving-client.ts', import.meta.url), [], {
  execArgv: ['--import', 'tsx'],
  env: { ...process.env, HANGAR_BENCH_URL: url, HANGAR_BENCH_KEY: key },
  stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
});

const input = (): GenerateInput => ({
  kind: 'completion',
  prompt: PROMPT,
  maxTokens: MAX_TOKENS,
  temperature: 0,
  signal: new AbortController().signal,
  onText: () => {},
});

async function inProcess(): Promise<number> {
  const done = await served.generate(input());
  return done.completionTokens;
}

/** Tokens per second of `clients` callers through the endpoint, measured at the client. */
function throughEndpoint(clients: number, requests: number, via: 'openai' | 'raw'): Promise<number> {
  return new Promise((resolve) => {
    client.once('message', (rate) => resolve(rate as number));
    client.send({ clients, requests, prompt: PROMPT, maxTokens: MAX_TOKENS, via });
  });
}

/** Tokens per second of `clients` callers, each making `requests` requests one after another. */
async function rate(one: () => Promise<number>, clients: number, requests: number): Promise<number> {
  const started = performance.now();
  const counts = await Promise.all(
    Array.from({ length: clients }, async () => {
      let n = 0;
      for (let i = 0; i < requests; i++) n += await one();
      return n;
    }),
  );
  const tokens = counts.reduce((a, b) => a + b, 0);
  return (tokens * 1000) / (performance.now() - started);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;

try {
  for (const clients of [1, PARALLEL]) {
    const requests = clients === 1 ? 8 : 2;
    const ways = {
      inProcess: () => rate(inProcess, clients, requests),
      openai: () => throughEndpoint(clients, requests, 'openai'),
      raw: () => throughEndpoint(clients, requests, 'raw'),
    };
    const got: Record<keyof typeof ways, number[]> = { inProcess: [], openai: [], raw: [] };
    const names = Object.keys(ways) as (keyof typeof ways)[];
    for (let round = 0; round <= ROUNDS; round++) {
      // Each way goes first in turn: whoever runs first meets a colder cache.
      const order = names.map((_, i) => names[(i + round) % names.length] as keyof typeof ways);
      for (const name of order) {
        const r = await ways[name]();
        if (round > 0) got[name].push(r); // round 0 warms up: JIT, the socket pool, llama.cpp's first batches
      }
    }
    const base = median(got.inProcess);
    const line = (name: 'openai' | 'raw') =>
      `${median(got[name]).toFixed(0)} tokens/s, ratio ${(median(got[name]) / base).toFixed(2)}×`;
    console.log(
      `serving, ${clients} client${clients === 1 ? '' : 's'}: in-process ${base.toFixed(0)} tokens/s; endpoint with the openai client ${line('openai')}; with Node's http ${line('raw')} (goal ≥ 0.95×; ${ROUNDS} rounds, medians)`,
    );
  }
} finally {
  client.kill();
  await http.close();
  await served.drain();
  await loaded.dispose();
  await runtime.dispose(500);
  await fs.rm(path.dirname(tiny.file), { recursive: true, force: true });
}
