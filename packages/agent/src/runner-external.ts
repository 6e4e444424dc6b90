import fs from 'node:fs/promises';
import path from 'node:path';
import { type Assignment, newEngineKey, type ReplicaState } from './control-plane.js';
import {
  type EngineKind,
  EngineStartError,
  exitReason,
  llamaServerArgs,
  startExternalEngine,
  urlHost,
  vllmArgs,
} from './engines/external.js';
import {
  type AdapterHost,
  type AdapterNote,
  DEFAULT_CONTEXT,
  MAX_CONTEXT,
  type Replica,
  type RunnerOptions,
} from './runner.js';

// A replica served by an engine in a child process (vLLM, or llama.cpp's llama-server): its files fetched whole
// from the mirror, the engine started on its GPU with a key of its own, its adapters given at start or loaded
// through vLLM's runtime LoRA API. Apart from runner.ts, which decides what runs; this is how such a replica runs.

/** What of the runner an external replica needs: its settings, and how a state change is said and reported. */
export type ExternalHost = {
  o: RunnerOptions;
  set(
    r: Replica,
    state: ReplicaState,
    fields: Partial<Pick<Replica, 'message' | 'smokeText' | 'tokensPerSecond' | 'served'>>,
  ): void;
  messageOf(r: Replica): string;
};

/**
 * An adapter that could not be fetched (the mirror down, a file cut short) is tried again after this long; one
 * llama.cpp refused is not, until it is published again: loading a broken file at every poll helps nobody.
 */
export const ADAPTER_FETCH_RETRY_MS = 60_000;

/**
 * An adapter that could not be had this time (not fetched, or its engine did not answer): refused by name, with
 * the reason, and tried again after ADAPTER_FETCH_RETRY_MS. A verdict on the adapter itself is not this.
 */
export function refuseForNow(
  o: Pick<RunnerOptions, 'adapterFetchRetryMs' | 'log'>,
  r: Replica,
  adapter: Assignment['adapters'][number],
  what: string,
  why: string,
): void {
  const retryMs = o.adapterFetchRetryMs ?? ADAPTER_FETCH_RETRY_MS;
  const note = `adapter "${adapter.name}" ${what}: ${why}; it is tried again in ${Math.ceil(retryMs / 1000)} s`;
  r.refused.set(adapter.name, { source: adapter.source, note, until: Date.now() + retryMs });
  o.log.warn(`an adapter ${what}`, { replicaId: r.assignment.replicaId, adapter: adapter.name, error: note });
}

/** How long an external engine may take to load before its replica fails: vLLM reads big weights onto the GPU. */
const ENGINE_READY_MS: Record<EngineKind, number> = { vllm: 10 * 60_000, 'llama-server': 5 * 60_000 };

/** vLLM's error message, from its JSON (flat in older releases, under `error` in newer ones) or its text. */
function vllmError(text: string): string {
  try {
    const body = JSON.parse(text) as { message?: unknown; error?: { message?: unknown } };
    const message = body.error?.message ?? body.message;
    if (typeof message === 'string') return message;
  } catch {
    // Not JSON: its own words, as they came.
  }
  return text.trim().slice(0, 500) || '(no body)';
}

/** A PEFT adapter's rank (adapter_config.json's `r`), for vLLM's --max-lora-rank; 0 when it does not say. */
async function loraRank(dir: string): Promise<number> {
  try {
    const config = JSON.parse(await fs.readFile(path.join(dir, 'adapter_config.json'), 'utf8')) as { r?: unknown };
    return typeof config.r === 'number' ? config.r : 0;
  } catch {
    return 0;
  }
}

/**
 * A replica served by an engine in a child process: started on a port the agent picks with a key it makes,
 * READY once the engine answers its probe, with that port as the endpoint and that key as the engine key, so
 * the control plane smoke-tests the engine itself. The key is never in a message or a log line.
 */
export async function runExternal(runner: ExternalHost, r: Replica, signal: AbortSignal) {
  const a = r.assignment;
  const ext = runner.o.external ?? { host: '127.0.0.1' };
  const resolve = (source: string) => new URL(source, `${runner.o.baseUrl}/`).toString();
  const cards = placedCards(a);
  const splitOver = a.gpuIndexes?.length ?? 0;
  let kind: EngineKind;
  let command: string[];
  let args: string[];
  let said = '';
  /** llama-server without its adapters, for when it will not start with them. */
  let withoutAdapters: string[] | undefined;
  /** The adapters the engine serves once it answers: those it was started with and took. */
  let accepted: string[] = [];
  /** vLLM's LoRA modules, by name, with the source each came from: held once the engine answers. */
  const modules = new Map<string, AdapterNote>();
  if (a.engine === 'vllm') {
    const vllm = await runner.o.vllmCommand();
    if (!vllm) throw new Error('vLLM is not installed on this node (no vllm on PATH, no HANGAR_AGENT_VLLM_COMMAND)');
    kind = 'vllm';
    command = vllm;
    // vLLM reads a local directory, not a URL: the mirror version's files, fetched whole and verified, are
    // handed to it as one directory of the cache (model-cache.ts fetchDir), and each PEFT adapter the same way.
    runner.set(r, 'LOADING', { message: 'fetching the weights from the mirror' });
    const weights = await runner.o.cache.fetchDir(resolve(a.source), signal);
    signal.throwIfAborted();
    const paths: string[] = [];
    let rank = 0;
    for (const adapter of a.adapters ?? []) {
      const dir = await fetchAdapterDir(runner, r, adapter, signal);
      if (!dir) continue;
      paths.push(`${adapter.name}=${dir}`);
      rank = Math.max(rank, await loraRank(dir));
      modules.set(adapter.name, { source: adapter.source, note: adapter.name });
    }
    said = weights.reused ? ' (weights from the cache)' : '';
    args = vllmArgs(a, weights.dir, paths, rank, splitOver);
    // vLLM refuses to start with LoRA enabled for a model it has no LoRA support for: it is started again
    // without, and serves the base model.
    withoutAdapters = vllmArgs(a, weights.dir, null, 0, splitOver);
  } else {
    kind = 'llama-server';
    command = ext.llamaServer ?? [];
    const cached = await runner.o.cache.fetchModel(resolve(a.source), signal);
    signal.throwIfAborted();
    // Adapters are fetched like the weights; one that cannot be fetched is named and left out, the base serves.
    const files: string[] = [];
    const named: string[] = [];
    for (const adapter of a.adapters ?? []) {
      try {
        const f = await runner.o.cache.fetchModel(resolve(adapter.source), signal);
        named.push(`${adapter.name} (lora id ${files.length})`);
        files.push(f.file);
        accepted.push(adapter.name);
      } catch (err) {
        signal.throwIfAborted();
        named.push(`adapter "${adapter.name}" was not fetched: ${(err as Error).message}`);
      }
    }
    if (named.length) said = `; adapters: ${named.join(', ')}`;
    const base = {
      file: cached.file,
      contextSize: Math.min(a.contextSize ?? DEFAULT_CONTEXT, MAX_CONTEXT),
      parallel: a.parallel ?? 1,
      splitOver,
    };
    args = llamaServerArgs({ ...base, adapters: files });
    if (files.length) withoutAdapters = llamaServerArgs({ ...base, adapters: [] });
  }
  runner.set(r, 'LOADING', { message: `starting ${kind}; waiting for it to answer` });
  const engineKey = newEngineKey();
  const start = (engineArgs: string[]) =>
    startExternalEngine({
      kind,
      command,
      args: engineArgs,
      host: ext.host,
      key: engineKey,
      readyMs: ext.readyMs ?? ENGINE_READY_MS[kind],
      graceMs: ext.graceMs ?? 15_000,
      probeMs: ext.probeMs,
      signal,
      env: {
        HANGAR_REPLICA_ID: a.replicaId,
        HANGAR_MODEL: a.model,
        HANGAR_MODEL_SOURCE: a.source,
        HANGAR_CONTEXT_SIZE: a.contextSize == null ? '' : String(a.contextSize),
        // Placed on one GPU of several: the engine sees that card alone, so two replicas on a two-GPU node
        // do not both load onto the first; split, it sees the cards of its split and no others.
        ...(cards ? { CUDA_VISIBLE_DEVICES: cards } : {}),
        // vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter exist only with this set: an adapter
        // published while the replica runs is loaded there (behind the engine key, which only the agent and the
        // control plane hold).
        ...(kind === 'vllm' ? { VLLM_ALLOW_RUNTIME_LORA_UPDATING: 'True' } : {}),
      },
    });
  let engine: Awaited<ReturnType<typeof start>>;
  try {
    engine = await start(args);
  } catch (err) {
    // llama-server refuses to start at all when one --lora file is bad and does not say which in a way to rely
    // on: the base model is started again without them, and the adapters are named as refused with its words.
    if (!withoutAdapters || !(err instanceof EngineStartError) || !err.exitedAtStart) throw err;
    // vLLM is started again only when its words are about LoRA: one that cannot load its weights would fail
    // the same way twice, and loading a large model twice only delays the reason.
    if (kind === 'vllm' && !/lora/i.test(err.message)) throw err;
    signal.throwIfAborted();
    if (kind === 'vllm') {
      r.noLora = err.message;
      for (const name of modules.keys()) modules.delete(name);
    } else {
      said = `; adapters ${(a.adapters ?? []).map((x) => `"${x.name}"`).join(', ')} were refused (${err.message}), the base model serves without them`;
    }
    accepted = [];
    engine = await start(withoutAdapters);
  }
  r.release = () => engine.stop();
  void engine.exited.then((e) => {
    if (r.abort.signal.aborted || (r.state !== 'LOADING' && r.state !== 'READY')) return;
    r.release = undefined;
    runner.set(r, 'FAILED', { message: exitReason(command, e), served: null });
  });
  signal.throwIfAborted();
  // The engine is reached at the agent's advertised host (it binds the agent's listen host), on its own port.
  const host = runner.o.serving ? new URL(runner.o.serving.endpoint()).hostname : urlHost(ext.host);
  if (kind === 'vllm') {
    // Its adapters follow the assignment while it runs, through its own API, as the in-process model's do.
    for (const [name, note] of modules) r.held.set(name, note);
    r.answers = () => [...r.held.keys()];
    if (!r.noLora) r.adapterHost = vllmAdapters(runner, r, `http://${urlHost(ext.host)}:${engine.port}`, engineKey);
  } else {
    r.answers = () => accepted;
    r.startedWith = a.adapters ?? [];
  }
  r.loadNote = `${kind} answers on port ${engine.port} (pid ${engine.pid})${cards ? ` on GPU ${cards}` : ''}${splitOver > 1 ? `, split ${splitOver} ways` : ''}${said}`;
  runner.set(r, 'READY', {
    message: runner.messageOf(r),
    served: { endpoint: `http://${host}:${engine.port}/v1`, engineKey },
  });
}

/** The cards a replica was placed on, as CUDA_VISIBLE_DEVICES lists them ("0", "2,3"); null: the node's own. */
export function placedCards(a: Pick<Assignment, 'gpuIndex' | 'gpuIndexes'>): string | null {
  if (a.gpuIndexes?.length) return a.gpuIndexes.join(',');
  return a.gpuIndex != null ? String(a.gpuIndex) : null;
}

/**
 * A PEFT adapter's directory for vLLM, fetched whole from its mirror version like the weights; null (the
 * adapter named as not fetched, tried again after a while) when it cannot be.
 */
async function fetchAdapterDir(
  runner: ExternalHost,
  r: Replica,
  adapter: Assignment['adapters'][number],
  signal: AbortSignal,
) {
  try {
    return (await runner.o.cache.fetchDir(new URL(adapter.source, `${runner.o.baseUrl}/`).toString(), signal)).dir;
  } catch (err) {
    signal.throwIfAborted();
    refuseForNow(runner.o, r, adapter, 'was not fetched', (err as Error).message);
    return null;
  }
}

/**
 * vLLM's own runtime LoRA API (POST /v1/load_lora_adapter {lora_name, lora_path}, /v1/unload_lora_adapter
 * {lora_name}; on with VLLM_ALLOW_RUNTIME_LORA_UPDATING), called with the engine key. vLLM loads the adapter
 * onto the engine before it answers 200, so a broken one is refused by name with vLLM's words and the base
 * and the other adapters keep serving. Unloading takes the name away from new requests at once.
 */
function vllmAdapters(runner: ExternalHost, r: Replica, base: string, key: string): AdapterHost {
  const call = async (route: string, body: Record<string, string>, signal?: AbortSignal) => {
    const res = await fetch(`${base}/v1/${route}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
      // Loading reads the adapter onto the GPU: seconds, not minutes.
      signal: AbortSignal.any([AbortSignal.timeout(120_000), ...(signal ? [signal] : [])]),
    });
    const text = await res.text();
    return { status: res.status, said: vllmError(text) };
  };
  return {
    load: async (adapter, signal) => {
      const dir = await fetchAdapterDir(runner, r, adapter, signal);
      if (!dir) return;
      signal.throwIfAborted();
      let res: Awaited<ReturnType<typeof call>>;
      try {
        res = await call('load_lora_adapter', { lora_name: adapter.name, lora_path: dir }, signal);
      } catch (err) {
        signal.throwIfAborted();
        // vLLM did not answer (busy, restarting): not its verdict on the adapter, so it is asked again later.
        refuseForNow(runner.o, r, adapter, 'could not be loaded', `vLLM did not answer (${(err as Error).message})`);
        return;
      }
      if (res.status === 200) {
        r.refused.delete(adapter.name);
        r.held.set(adapter.name, { source: adapter.source, note: adapter.name });
        runner.o.log.info('an adapter is loaded', { replicaId: r.assignment.replicaId, adapter: adapter.name });
        return;
      }
      const note = `adapter "${adapter.name}" was refused by vLLM (HTTP ${res.status}): ${res.said}`;
      r.refused.set(adapter.name, { source: adapter.source, note });
      runner.o.log.warn('an adapter was refused', {
        replicaId: r.assignment.replicaId,
        adapter: adapter.name,
        error: note,
      });
    },
    unload: async (name) => {
      const res = await call('unload_lora_adapter', { lora_name: name });
      // 404: vLLM no longer has it, which is what was asked.
      if (res.status !== 200 && res.status !== 404)
        throw new Error(`vLLM answered ${res.status} to unloading "${name}": ${res.said}`);
    },
  };
}
