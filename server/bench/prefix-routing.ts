import { type ChildProcess, fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { openAiClient } from '@hangar/common/test/fixtures/openai-client';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { createApp } from '../src/app.js';
import { hashSecret } from '../src/auth/secrets.js';
import { loadConfig } from '../src/config.js';
import type { RoutingPolicy } from '../src/generated/prisma/enums.js';
import { benchToken } from './api-token.js';

// What routing by prefix buys a multi-turn workload (#29). Two replicas of one model, each a process of its own
// running the agent's serving stack on real llama.cpp (prefix-routing-replica.ts), behind a real Hangar (createApp,
// PostgreSQL, a caller token). The model is a random-weight llama generated from the test fixture, large enough
// that evaluating a prompt is what a turn costs (`SHAPE`); its text is noise, its compute is real. 8 conversations
// at once, 10 turns each, every one opening with the same ~1,000-token system prompt. Three ways, interleaved round
// by round (the order rotates), each conversation new per round:
//   before   LEAST_LOADED over replicas that clear each sequence after a request: Hangar before #29;
//   least    LEAST_LOADED over replicas that keep and reuse KV state: the node's reuse without the routing;
//   prefix   PREFIX (the default) over the same replicas: a conversation stays where its history is cached.
// Reported per way: mean and p90 time to first token of turn 1 and of turns 2–10, and the round's total time; the
// ratios are against prefix. Goal: prefix ≥ 3× faster to first token than `before` on turns after the first.
// Absolute numbers depend on the machine (and on what else runs on it): the ratios are what to read.
//
// `tsx bench/prefix-routing.ts [rounds]` (default 2).

const ROUNDS = Number(process.argv[2] ?? 2);
const CONVERSATIONS = 8;
const TURNS = 10;
const PARALLEL = 4;
const GOAL = 3;
const SHAPE = { embd: 256, layers: 4, heads: 4, kvHeads: 4, ff: 768 };

const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.join(os.tmpdir(), `hangar-bench-prefix-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const gguf = path.join(root, 'bench-llama.gguf');
await fs.writeFile(gguf, tinyLlama({ shape: SHAPE, context: 4096 }));

/** A replica process; resolves with its endpoint (…/v1) and engine key once it listens. */
function replica(name: string, reuse: boolean) {
  const child = fork(path.join(here, 'prefix-routing-replica.ts'), [], {
    execArgv: ['--import', 'tsx'],
    env: {
      ...process.env,
      HANGAR_BENCH_GGUF: gguf,
      HANGAR_BENCH_NAME: name,
      HANGAR_BENCH_PARALLEL: String(PARALLEL),
      HANGAR_BENCH_REUSE: reuse ? '1' : '0',
    },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const ready = new Promise<{ endpoint: string; key: string }>((resolve, reject) => {
    child.once('message', (m) => resolve(m as { endpoint: string; key: string }));
    child.once('exit', (code) => reject(new Error(`a replica of ${name} exited (${code}) before it listened`)));
  });
  return { child, ready };
}

const children: ChildProcess[] = [];
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
const hangar = await app.start();
const db = app.db.prisma;
const token = await benchToken(hangar, { callerOnly: true });

// Two nodes as their agents would have reported them (kept online below), each with one replica of each model.
const nodes = await Promise.all(
  ['bench-a', 'bench-b'].map((name) =>
    db.node.create({
      data: {
        name,
        tokenHash: hashSecret(randomBytes(16).toString('hex')),
        lastSeenAt: new Date(),
        engines: [{ name: 'llama.cpp', version: 'bench', build: 9999 }],
      },
    }),
  ),
);
const heartbeat = setInterval(
  () => void db.node.updateMany({ data: { lastSeenAt: new Date() } }).catch(() => {}),
  5000,
);
// The replica processes first, then each model with its replicas in one write: a model without its replicas for a
// moment would have the placement pass place new ones of its own.
const processes = await Promise.all(
  (['cleared', 'kept'] as const).flatMap((model) =>
    nodes.map(async (node) => {
      const r = replica(model, model === 'kept');
      children.push(r.child);
      return { model, node, ...(await r.ready) };
    }),
  ),
);
for (const model of ['cleared', 'kept'] as const) {
  await db.catalogModel.create({
    data: {
      name: model,
      source: 'bench/generated',
      engine: 'llamacpp',
      minReplicas: 2,
      maxReplicas: 2,
      replicas: {
        create: processes
          .filter((p) => p.model === model)
          .map((p) => ({
            nodeId: p.node.id,
            state: 'READY' as const,
            endpoint: `${p.endpoint.replace(/\/+$/, '').replace(/\/v1$/, '')}/v1`,
            engineKey: { create: { key: p.key } },
          })),
      },
    },
  });
}
await app.services.gateway.routes.refresh();
const client = openAiClient(hangar, token, { timeoutMs: 600_000 });

// The shared system prompt: ~1,000 tokens of an operator's standing instructions.
const SYSTEM = Array.from(
  { length: 34 },
  (_, i) =>
    `Rule ${i + 1}: before flight ${100 + i}, the crew of bay ${(i % 7) + 1} checks door ${i * 3}, logs the fuel level, and reports to the duty officer.`,
).join(' ');

type Message = { role: 'system' | 'user' | 'assistant'; content: string };
type Way = { name: 'before' | 'least' | 'prefix'; model: 'cleared' | 'kept'; policy: RoutingPolicy };
const WAYS: Way[] = [
  { name: 'before', model: 'cleared', policy: 'LEAST_LOADED' },
  { name: 'least', model: 'kept', policy: 'LEAST_LOADED' },
  { name: 'prefix', model: 'kept', policy: 'PREFIX' },
];

type Sample = { turn: number; ttftMs: number; promptTokens: number; cachedTokens: number };

/** One streamed turn: time to the first piece of text (or to the end, for an answer with none). */
async function ask(model: string, messages: Message[]) {
  const started = performance.now();
  let first: number | undefined;
  let text = '';
  let usage: { prompt_tokens?: number; prompt_tokens_details?: { cached_tokens?: number } } | undefined;
  const stream = await client.chat.completions.create({
    model,
    messages,
    max_tokens: 4,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    const piece = chunk.choices[0]?.delta?.content;
    if (piece) {
      first ??= performance.now();
      text += piece;
    }
    if (chunk.usage) usage = chunk.usage as typeof usage;
  }
  return {
    ttftMs: (first ?? performance.now()) - started,
    text,
    promptTokens: usage?.prompt_tokens ?? 0,
    cachedTokens: usage?.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

async function run(way: Way, round: number) {
  await db.catalogModel.update({ where: { name: way.model }, data: { routing: way.policy } });
  await app.services.gateway.routes.refresh();
  const samples: Sample[] = [];
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONVERSATIONS }, async (_, c) => {
      const messages: Message[] = [
        { role: 'system', content: SYSTEM },
        {
          role: 'user',
          content: `Round ${round}, ${way.name}, crew ${c}: walk me through the checks for bay ${c + 1} in order, one at a time, starting with the doors and the fuel.`,
        },
      ];
      for (let turn = 1; turn <= TURNS; turn++) {
        const got = await ask(way.model, messages);
        samples.push({ turn, ttftMs: got.ttftMs, promptTokens: got.promptTokens, cachedTokens: got.cachedTokens });
        messages.push({ role: 'assistant', content: got.text || '…' });
        messages.push({
          role: 'user',
          content: `Turn ${turn + 1} for crew ${c}: next check please, and say which door number and which flight it belongs to, and what to log.`,
        });
      }
    }),
  );
  return { samples, totalMs: performance.now() - started };
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
const p90 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(0.9 * xs.length))] ?? 0;
const ms = (x: number) => `${x.toFixed(0)} ms`;

try {
  // Warm-up: each replica process evaluates the system prompt once (JIT, llama.cpp's buffers), per model.
  for (const model of ['cleared', 'kept'])
    for (let i = 0; i < 4; i++)
      await ask(model, [
        { role: 'system', content: 'warm up' },
        { role: 'user', content: `hello ${i}` },
      ]);

  const results = new Map<Way['name'], { samples: Sample[]; totals: number[] }>();
  for (const w of WAYS) results.set(w.name, { samples: [], totals: [] });
  for (let round = 0; round < ROUNDS; round++) {
    const order = WAYS.map((_, i) => WAYS[(i + round) % WAYS.length]!);
    for (const way of order) {
      const r = await run(way, round);
      const into = results.get(way.name)!;
      into.samples.push(...r.samples);
      into.totals.push(r.totalMs);
      console.log(`  round ${round + 1} ${way.name.padEnd(6)} total ${ms(r.totalMs)}`);
    }
  }

  const first = results.get('prefix')!.samples.find((s) => s.turn === 1);
  console.log(
    `prefix routing, ${CONVERSATIONS} conversations × ${TURNS} turns at once, 2 replicas (${PARALLEL} sequences each), system prompt ${first?.promptTokens ?? '?'} tokens at turn 1, ${ROUNDS} rounds interleaved`,
  );
  const later = (name: Way['name']) => results.get(name)!.samples.filter((s) => s.turn > 1);
  const opening = (name: Way['name']) => results.get(name)!.samples.filter((s) => s.turn === 1);
  const prefixLater = mean(later('prefix').map((s) => s.ttftMs));
  for (const way of WAYS) {
    const r = results.get(way.name)!;
    const l = later(way.name).map((s) => s.ttftMs);
    const o = opening(way.name).map((s) => s.ttftMs);
    const cached = later(way.name);
    const share =
      cached.reduce((a, s) => a + s.cachedTokens, 0) /
      Math.max(
        1,
        cached.reduce((a, s) => a + s.promptTokens, 0),
      );
    const totals = r.totals.map((x) => x.toFixed(0)).join(', ');
    console.log(
      `  ${way.name.padEnd(6)} turn 1: mean ${ms(mean(o))} p90 ${ms(p90(o))} | turns 2–${TURNS}: mean ${ms(mean(l))} p90 ${ms(p90(l))} (${(100 * share).toFixed(0)}% of prompt tokens cached) | total per round ${totals} ms | later-turn TTFT ${(mean(l) / prefixLater).toFixed(2)}× prefix's`,
    );
  }
  const before = mean(later('before').map((s) => s.ttftMs)) / prefixLater;
  const least = mean(later('least').map((s) => s.ttftMs)) / prefixLater;
  console.log(
    `  goal: prefix ≥ ${GOAL}× faster to first token than before on later turns: ${before.toFixed(2)}× ${before >= GOAL ? 'met' : 'MISSED'}; against least-loaded with reuse: ${least.toFixed(2)}×`,
  );
} catch (err) {
  // Where the fleet stood when it failed: a replica the control plane set aside says why.
  const rows = await db.replica.findMany({ include: { model: true, node: true } });
  for (const r of rows)
    console.error(`  ${r.model.name} on ${r.node?.name}: ${r.state}/${r.desired} ${r.message ?? ''}`);
  throw err;
} finally {
  clearInterval(heartbeat);
  for (const c of children) c.disconnect();
  await app.stop();
  await fs.rm(root, { recursive: true, force: true });
}
