import { spawn } from 'node:child_process';
import { freePort } from '@hangar/common/free-port';
import { sleep } from '@hangar/common/retry';
import type { Assignment } from '../control-plane.js';

// An engine the agent runs as a child process instead of in its own: llama.cpp's `llama-server` or `vllm serve`.
// The agent picks its port, generates the key it takes (--api-key, given through the environment), binds it to the agent's own listen host, and
// calls it ready only once it answers its probe; it never trusts "still running after a while". A child that
// exits, or does not answer before the deadline, is reported with its last lines of output: the engine's own
// words are what tells an operator why weights did not load.

export type EngineKind = 'llama-server' | 'vllm';

export type ExternalEngineOptions = {
  kind: EngineKind;
  /** The program and the arguments before the agent's own (`vllm serve`, or llama-server's path). */
  command: string[];
  /** What the engine loads and how: everything but host, port and key (see llamaServerArgs, vllmArgs). */
  args: string[];
  /** The address it binds: the agent's listen host. */
  host: string;
  key: string;
  /** How long loading may take before the replica fails (vLLM loading a 70B model takes minutes). */
  readyMs: number;
  /** Between SIGTERM and SIGKILL when stopping. */
  graceMs: number;
  /** Between probes. */
  probeMs?: number;
  env?: Record<string, string>;
  signal?: AbortSignal;
};

export type ExitInfo = { code: number | null; signal: NodeJS.Signals | null; tail: string };

export type ExternalEngine = {
  pid: number;
  port: number;
  /** Resolves when the child exits, with its last lines of output. */
  exited: Promise<ExitInfo>;
  stop(): Promise<void>;
};

export class EngineStartError extends Error {
  override name = 'EngineStartError';
  constructor(
    message: string,
    /** The engine exited by itself (it refused what it was given), rather than not answering in time. */
    readonly exitedAtStart = false,
  ) {
    super(message);
  }
}

/** Lines of the engine's output kept for the reason; vLLM's traceback ends with the line that matters. */
const TAIL_LINES = 8;

/** Where each engine reads its --api-key from when the flag is absent (llama.cpp common/arg.cpp; vLLM's CLI). */
const KEY_ENV: Record<EngineKind, string> = { 'llama-server': 'LLAMA_API_KEY', vllm: 'VLLM_API_KEY' };

/** What each engine answers 200 on once its weights are loaded, and whether that needs the key. */
const PROBE: Record<EngineKind, { path: string; keyed: boolean }> = {
  // llama-server answers /health 503 while loading and 200 after, without a key.
  'llama-server': { path: '/health', keyed: false },
  // vLLM's /health is 200 before the OpenAI routes are up; /v1/models, with the key, proves the key works too.
  vllm: { path: '/v1/models', keyed: true },
};

function describeExit(program: string, e: ExitInfo) {
  const how = e.signal ? `was ended by ${e.signal}` : `exited with code ${e.code}`;
  return `${program} ${how}${e.tail ? `; its last lines: ${e.tail}` : ' without a word of output'}`;
}

/** `exitReason` for a report once a ready engine exits. */
export function exitReason(command: string[], e: ExitInfo) {
  return describeExit(command[0] ?? 'the engine', e);
}

/**
 * Starts the engine and resolves once its probe answers 200. Rejects with EngineStartError (the child ended)
 * when it exits first, or when `readyMs` passes, each with its last lines; aborted by `signal`, it ends the child.
 */
export async function startExternalEngine(o: ExternalEngineOptions): Promise<ExternalEngine> {
  const [program, ...pre] = o.command;
  if (!program) throw new EngineStartError(`no ${o.kind} command to run`);
  const port = await freePort();
  const child = spawn(program, [...pre, ...o.args, '--host', o.host, '--port', String(port)], {
    // The agent's environment (CUDA_VISIBLE_DEVICES, HF_HOME and the like) plus the replica's, and the key in
    // the variable the engine reads in place of --api-key: a command line is readable by every user of the node
    // (ps, /proc/<pid>/cmdline), a process's environment only by its owner.
    env: { ...process.env, ...o.env, [KEY_ENV[o.kind]]: o.key },
    stdio: ['ignore', 'pipe', 'pipe'],
    // Its own process group, so stopping it also stops the workers vLLM starts.
    detached: true,
  });
  const lines: string[] = [];
  const keep = (b: Buffer) => {
    for (const l of b.toString('utf8').split(/\r?\n/)) if (l.trim()) lines.push(l.trim());
    if (lines.length > 50) lines.splice(0, lines.length - 50);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  // The engines do not print their key, but never let it reach a report if one did.
  const tail = () => lines.slice(-TAIL_LINES).join(' | ').replaceAll(o.key, '(engine key)');
  const exited = new Promise<ExitInfo>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal, tail: tail() })),
  );
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', (err) =>
      reject(new EngineStartError(`${program} could not be started: ${err.message}; check the ${o.kind} command`)),
    );
  });
  const pid = child.pid as number;
  let stopping: Promise<void> | undefined;
  const signalGroup = (sig: NodeJS.Signals) => {
    try {
      process.kill(-pid, sig);
    } catch {
      // Already gone.
    }
  };
  const engine: ExternalEngine = {
    pid,
    port,
    exited,
    stop: () => {
      stopping ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        signalGroup('SIGTERM');
        // Both engines free GPU memory on SIGTERM within seconds; one that hangs is killed so the card is not held.
        const killer = setTimeout(() => signalGroup('SIGKILL'), o.graceMs);
        await exited;
        clearTimeout(killer);
      })();
      return stopping;
    },
  };

  const probe = PROBE[o.kind];
  const url = `http://${o.host.includes(':') ? `[${o.host}]` : o.host}:${port}${probe.path}`;
  const deadline = Date.now() + o.readyMs;
  let last = 'no answer yet';
  let gone: ExitInfo | undefined;
  void exited.then((e) => {
    gone = e;
  });
  try {
    while (!gone) {
      o.signal?.throwIfAborted();
      if (Date.now() > deadline) {
        await engine.stop();
        throw new EngineStartError(
          `${program} did not answer GET ${probe.path} with 200 within ${Math.round(o.readyMs / 1000)} s (last: ${last}); it was stopped; its last lines: ${tail() || '(none)'}`,
        );
      }
      try {
        const res = await fetch(url, {
          headers: probe.keyed ? { authorization: `Bearer ${o.key}` } : {},
          signal: o.signal ? AbortSignal.any([AbortSignal.timeout(5000), o.signal]) : AbortSignal.timeout(5000),
        });
        await res.arrayBuffer().catch(() => {});
        if (res.ok) return engine;
        last = `HTTP ${res.status}`;
      } catch (err) {
        last = ((err as Error).cause as Error | undefined)?.message ?? (err as Error).message;
      }
      await Promise.race([sleep(o.probeMs ?? 250), exited]);
    }
    throw new EngineStartError(describeExit(program, gone), true);
  } catch (err) {
    await engine.stop();
    throw err;
  }
}

/** The advertised host as a URL's host part: IPv6 in brackets. */
export function urlHost(host: string) {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
}

/**
 * llama-server's arguments for an assignment: the cached GGUF, its context, its slots, and each adapter loaded
 * at start but applied to no request unless it asks (--lora-init-without-apply; a request names it in its
 * `lora: [{id, scale}]` field, the id being its place in this list). Prompt caching needs no flag: each request's
 * `cache_prompt` defaults to true, so a slot keeps its KV state and a request reuses the longest matching start of
 * the slot it lands in; the gateway's prefix routing sends a conversation to the replica that holds it.
 */
export function llamaServerArgs(o: {
  file: string;
  contextSize: number;
  parallel: number;
  adapters: string[];
  /** Cards the model is split across (the engine sees those alone, by CUDA_VISIBLE_DEVICES); 0 or 1: none. */
  splitOver?: number;
}) {
  const args = ['-m', o.file, '-c', String(o.contextSize * o.parallel), '-np', String(o.parallel)];
  // Placement booked an equal share on each card: llama.cpp's own split follows free memory, which on a card
  // shared with other replicas is not what was booked, so the split is said outright, layer by layer.
  if (o.splitOver && o.splitOver > 1)
    args.push('--split-mode', 'layer', '--tensor-split', Array(o.splitOver).fill('1').join(','));
  for (const f of o.adapters) args.push('--lora', f);
  if (o.adapters.length) args.push('--lora-init-without-apply');
  return args;
}

/** The --max-lora-rank values vLLM accepts (its CLI refuses others). */
const VLLM_LORA_RANKS = [8, 16, 32, 64, 128, 256, 320, 512];

/**
 * vLLM's arguments: what it loads (a local directory: the mirror version's files in the cache), under the model's
 * name (so requests say `model: "<name>"`), and its adapters as LoRA modules requests name as models. LoRA is
 * on even with no adapter yet, so one published later loads at runtime (/v1/load_lora_adapter); `adapters`
 * null starts it without LoRA. --max-lora-rank is raised to fit the highest rank it starts with (vLLM's default
 * is 16; the trainer's ranks go to 256); one loaded later above it is refused by vLLM, by name.
 */
export function vllmArgs(
  a: Pick<Assignment, 'model' | 'contextSize' | 'gpuMemoryFraction'>,
  weights: string,
  adapters: string[] | null,
  rank = 0,
  /** Cards the model is split across (tensor parallelism, one shard on each); 0 or 1: one card. */
  splitOver = 0,
) {
  // Prefix caching named even where it is vLLM's default (V1): a conversation's earlier turns are not computed again
  // on the replica the gateway's prefix routing keeps it on.
  const args = [weights, '--served-model-name', a.model, '--enable-prefix-caching'];
  if (a.contextSize) args.push('--max-model-len', String(a.contextSize));
  if (splitOver > 1) args.push('--tensor-parallel-size', String(splitOver));
  // vLLM takes 90 % of each card it sees unless told: on a card shared with other replicas it may take only the
  // share placement booked for it.
  if (a.gpuMemoryFraction) args.push('--gpu-memory-utilization', String(a.gpuMemoryFraction));
  if (adapters) {
    args.push('--enable-lora');
    const fits = VLLM_LORA_RANKS.find((r) => r >= rank);
    if (rank > 16 && fits) args.push('--max-lora-rank', String(fits));
    if (adapters.length) args.push('--lora-modules', ...adapters);
  }
  return args;
}
