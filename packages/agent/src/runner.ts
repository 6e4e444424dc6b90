import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import { sleep } from '@hangar/common/retry';
import {
  type Assignment,
  type ControlPlane,
  ControlPlaneError,
  newEngineKey,
  type ReplicaReport,
  type ReplicaState,
} from './control-plane.js';
import type { LlamaRuntime } from './llama-runtime.js';
import type { ModelCache } from './model-cache.js';
import type { OpenAiServer } from './openai/http.js';
import { LlamaServedModel } from './openai/llama-model.js';
import { type ExternalHost, placedCards, refuseForNow, runExternal } from './runner-external.js';

// Makes this node run what the control plane assigns to it. The assignments are pushed over the agent's channel
// (ControlPlane.pushed) the moment they change, and read every couple of seconds only while that channel is down
// (or the control plane does not push them); each list is the whole list, so a reconnect catches up on whatever
// changed meanwhile. It starts each replica it should run (fetch, load, smoke test), stops each it should not,
// and reports every state change. A report that does not get through is sent again at the next tick, and only
// the latest state counts: a control plane that restarts misses nothing it needs.
// A replica in a child process (vLLM, llama-server) runs in runner-external.ts. What is left is over 400 lines
// for a reason: the in-process llama.cpp replica, its adapters (loaded, refused, retried) and the reports are one
// replica's state, changed by the poll, the load and a stop alike; apart, each would reach into the others' fields.

export type RunnerOptions = {
  controlPlane: ControlPlane;
  cache: ModelCache;
  /** llama.cpp for this process, started on first use; rejects with the reason when it cannot run here. */
  runtime: () => Promise<LlamaRuntime>;
  /** The command that serves a vLLM replica here, or null when vLLM is not installed. */
  vllmCommand: () => Promise<string[] | null>;
  /** The control plane's URL, against which a relative source is resolved. */
  baseUrl: string;
  log: Logger;
  /** How often the assignments are read while they are not pushed, and unsent reports are sent again. */
  pollMs?: number;
  /**
   * Engines run as child processes (engines/external.ts): bound to `host` (the agent's listen host) on a port
   * the agent picks; `llamaServer` (HANGAR_AGENT_LLAMA_SERVER), when set, serves llama.cpp replicas instead of
   * the embedded runtime. `readyMs` overrides how long each may take to answer its probe.
   */
  external?: { host: string; llamaServer?: string[] | null; readyMs?: number; graceMs?: number; probeMs?: number };
  /**
   * The agent's OpenAI-compatible endpoint, where each llama.cpp replica is served under a key of its own once
   * it loads; `endpoint()` is its base URL as the control plane reaches it (…/v1). Without it a replica loads
   * but nothing can call it, and the control plane records it FAILED.
   */
  serving?: { http: OpenAiServer; endpoint: () => string; queueLimit?: number };
  /** How long an adapter that could not be fetched waits before it is tried again (ADAPTER_FETCH_RETRY_MS). */
  adapterFetchRetryMs?: number;
};

/** Requests that may wait for a sequence beyond those generating, per replica, before it answers 429. */
const DEFAULT_QUEUE_LIMIT = 64;

export type Replica = {
  assignment: Assignment;
  state: ReplicaState;
  message: string | null;
  smokeText: string | null;
  tokensPerSecond: number | null;
  /** Sent with READY (see ReplicaReport): where the replica answers, the key it takes, what it holds. */
  served: Served | null;
  /** Bumped at each change; the report of a version is sent until the control plane has taken it. */
  version: number;
  reported: number;
  sending?: Promise<void>;
  abort: AbortController;
  starting?: Promise<void>;
  /** Undoes what starting made: disposes the model, or ends the child. */
  release?: () => Promise<void>;
  stopping?: Promise<void>;
  /** No longer assigned: forgotten once its STOPPED has been reported. */
  forget?: boolean;
  /** The adapters it answers for now (READY), by name: sent with every report, for the gateway's routing. */
  answers: () => string[];
  /** What the message says of the load, before what it says of the adapters (which changes as they do). */
  loadNote?: string;
  /** The model's adapters as the latest assignment lists them. */
  wanted: Assignment['adapters'];
  /** In-process llama.cpp: the served model, whose adapters follow the assignment while it runs. */
  model?: LlamaServedModel;
  /** Adapters loaded on `model`, by name, with the source they came from and what the message says of them. */
  held: Map<string, AdapterNote>;
  /** Adapters that would not load, by name: not tried again until their source changes (or `until`). */
  refused: Map<string, AdapterNote & { until?: number }>;
  /** The one adapter sync running on this replica; a newer assignment waits for it and goes next. */
  syncing?: Promise<void>;
  /** Adapters being unloaded, by name: each resolves once its last request is done and its context is gone. */
  leaving: Map<string, Promise<void>>;
  /** An external engine: the adapters it was started with (whether or not it took them). */
  startedWith?: Assignment['adapters'];
  /**
   * Where the replica's adapters are loaded and unloaded while it runs: the in-process model, or vLLM's runtime
   * API. Without one (llama-server, vLLM that refused LoRA) they change only at the next start.
   */
  adapterHost?: AdapterHost;
  /** vLLM would not start with LoRA enabled (a model it has no LoRA support for): why, in its words. */
  noLora?: string;
};

export type AdapterNote = { source: string; note: string };

/** Loads one adapter (noting it in `held` or `refused`), or unloads one (resolving once it is gone). */
export type AdapterHost = {
  load(adapter: Assignment['adapters'][number], signal: AbortSignal): Promise<void>;
  unload(name: string): Promise<void>;
};

/** Resolves when the signal aborts (never rejects): for racing a wait that a stop should cut short. */
const aborted = (signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener('abort', () => resolve(), { once: true });
  });

/** What a READY report carries beyond the state: the control plane smoke-tests `endpoint` with `engineKey`. */
export type Served = Pick<ReplicaReport, 'endpoint' | 'engineKey' | 'gpuLayers' | 'totalLayers' | 'vramUsedBytes'>;

/**
 * Where an in-process replica was placed, for its message. node-llama-cpp 3.22 cannot pick a model's devices, so
 * a split replica spreads over every card this process sees (llama.cpp's default split, by free memory); an exact
 * split over the placed cards alone needs llama-server (HANGAR_AGENT_LLAMA_SERVER), which is given them.
 */
function placedWords(a: Assignment): string {
  const cards = placedCards(a);
  if (!cards) return '';
  return a.gpuIndexes && a.gpuIndexes.length > 1 ? `, placed split across GPUs ${cards}` : `, placed on GPU ${cards}`;
}

/** A context larger than this is not needed to prove a model loads and generates, and costs memory on a node. */
export const MAX_CONTEXT = 2048;
export const DEFAULT_CONTEXT = 512;

export class Runner {
  private readonly replicas = new Map<string, Replica>();
  private polling: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private lastPollError: string | undefined;
  /** A pushed list has come since the channel was last lost: polling would only read the same again. */
  private live = false;
  /** Lists pushed so far: a poll answered after a push read an older list, and is not acted on. */
  private pushes = 0;
  private unpush: (() => void) | undefined;

  /** What a replica run by an engine in a child process (runner-external.ts) is given of this runner. */
  private readonly externalHost: ExternalHost;

  constructor(private readonly o: RunnerOptions) {
    this.externalHost = {
      o,
      set: (r, state, fields) => this.set(r, state, fields),
      messageOf: (r) => this.messageOf(r),
    };
  }

  /**
   * Takes the pushed assignments, and every pollMs until stopAll() polls (while nothing is pushed) or sends
   * the reports that did not get through (while lists are pushed).
   */
  start() {
    const tick = () => {
      if (this.closed) return;
      void this.refresh().finally(() => {
        if (!this.closed) {
          clearTimeout(this.timer);
          this.timer = setTimeout(tick, this.o.pollMs ?? 2000);
        }
      });
    };
    this.unpush = this.o.controlPlane.pushed?.({
      onList: (list) => {
        this.pushes++;
        if (!this.live) this.o.log.info('the control plane pushes this node’s assignments; polling stops');
        this.live = true;
        if (this.closed) return;
        this.reconcile(list);
        void this.flush();
      },
      onLost: () => {
        if (!this.live) return;
        this.live = false;
        this.o.log.info('the assignments are not pushed while the channel is down: they are read every pollMs', {
          pollMs: this.o.pollMs ?? 2000,
        });
        // At once: a change made while the channel is down must not wait a whole interval more than it has to.
        clearTimeout(this.timer);
        tick();
      },
    });
    tick();
  }

  /** Polls unless the assignments are pushed; then sends only what was not reported yet. */
  refresh(): Promise<void> {
    return this.live ? this.flush() : this.poll();
  }

  /**
   * After a heartbeat: the placement may have changed with what the node reported. Where the assignments are
   * pushed (start() subscribed), the change comes that way, or by the pollMs polls while the channel is down;
   * otherwise they are read now.
   */
  afterHeartbeat(): Promise<void> {
    return this.unpush ? this.flush() : this.poll();
  }

  /** Replicas loading or serving here. */
  running(): number {
    let n = 0;
    for (const r of this.replicas.values()) if (r.state === 'LOADING' || r.state === 'READY') n++;
    return n;
  }

  /**
   * Resolves once no replica here is loading or serving (the control plane drained and stopped them, with their
   * stops reported), true; or false after `ms`, or once `heard()` (the control plane can reach this node) has been
   * false for three seconds: a control plane that went away asks for no stop.
   */
  async drained(ms: number, heard: () => boolean = () => true): Promise<boolean> {
    const deadline = Date.now() + ms;
    let deafSince: number | undefined;
    while (Date.now() < deadline) {
      if (this.running() === 0 && [...this.replicas.values()].every((r) => r.reported === r.version)) return true;
      if (heard()) deafSince = undefined;
      else {
        deafSince ??= Date.now();
        if (Date.now() - deafSince >= 3000) break;
      }
      await sleep(100);
    }
    return this.running() === 0;
  }

  /** What the runner holds, for tests and logs. */
  snapshot() {
    return [...this.replicas.values()].map((r) => ({
      replicaId: r.assignment.replicaId,
      state: r.state,
      message: r.message,
      reported: r.reported === r.version,
    }));
  }

  /** Asks for the assignments once and acts on them; overlapping calls share one poll. */
  poll(): Promise<void> {
    this.polling ??= (async () => {
      try {
        const pushes = this.pushes;
        const list = await this.o.controlPlane.assignments();
        if (this.lastPollError) this.o.log.info('the control plane answers assignments again');
        this.lastPollError = undefined;
        // A list pushed while this one was on its way is newer: this one could stop a replica just placed.
        if (!this.closed && pushes === this.pushes) this.reconcile(list);
      } catch (err) {
        const msg = (err as Error).message;
        // Once per distinct reason: a control plane that is down for an hour should not write 1800 lines.
        if (msg !== this.lastPollError) this.o.log.warn('could not read this node’s assignments', { error: msg });
        this.lastPollError = msg;
      }
      await this.flush();
    })().finally(() => {
      this.polling = undefined;
    });
    return this.polling;
  }

  private reconcile(list: Assignment[]) {
    const assigned = new Set<string>();
    for (const a of list) {
      assigned.add(a.replicaId);
      const r = this.replicas.get(a.replicaId);
      if (a.desired === 'RUN') {
        // A replica that failed stays failed until the control plane places it again (under a new id): retrying
        // here would load a broken file every two seconds.
        if (!r || (r.state === 'STOPPED' && !r.stopping)) this.launch(a);
        else if (r.state === 'READY' && !r.stopping) this.followAdapters(r, a.adapters ?? []);
      } else if (!r) {
        // Not running here (an agent restart, say): confirm it, once.
        const stopped = this.track(a, 'STOPPED');
        stopped.message = 'not running on this node';
      } else if (r.state !== 'STOPPED' || r.stopping) {
        void this.stop(r, 'stopped, as the control plane asked');
      }
    }
    for (const r of this.replicas.values()) {
      if (assigned.has(r.assignment.replicaId)) continue;
      if (r.state === 'LOADING' || r.state === 'READY') {
        r.forget = true;
        void this.stop(r, 'stopped: no longer assigned to this node');
      } else if (!r.stopping && !r.sending && r.reported === r.version) {
        this.replicas.delete(r.assignment.replicaId);
      } else {
        r.forget = true;
      }
    }
  }

  private track(a: Assignment, state: ReplicaState): Replica {
    const r: Replica = {
      assignment: a,
      state,
      message: null,
      smokeText: null,
      tokensPerSecond: null,
      served: null,
      version: 1,
      reported: 0,
      abort: new AbortController(),
      answers: () => [],
      wanted: a.adapters ?? [],
      held: new Map(),
      refused: new Map(),
      leaving: new Map(),
    };
    this.replicas.set(a.replicaId, r);
    return r;
  }

  private launch(a: Assignment) {
    const r = this.track(a, 'LOADING');
    r.message = a.engine === 'vllm' ? 'starting vLLM' : 'fetching the model';
    this.o.log.info('starting a replica', { replicaId: a.replicaId, model: a.model, engine: a.engine });
    void this.send(r);
    r.starting = this.run(r);
  }

  private async run(r: Replica) {
    const a = r.assignment;
    const signal = r.abort.signal;
    try {
      if (a.engine === 'vllm' || (a.engine === 'llamacpp' && this.o.external?.llamaServer)) {
        await runExternal(this.externalHost, r, signal);
        return;
      }
      if (a.engine !== 'llamacpp') throw new Error(`this agent runs llamacpp and vllm replicas, not "${a.engine}"`);
      const runtime = await this.o.runtime().catch((err: Error) => {
        throw new Error(`llama.cpp cannot run on this node: ${err.message}`);
      });
      const cached = await this.o.cache.fetchModel(new URL(a.source, `${this.o.baseUrl}/`).toString(), signal);
      signal.throwIfAborted();
      this.set(r, 'LOADING', { message: `loading ${path.basename(cached.file)}` });
      const parallel = a.parallel ?? 1;
      const loaded = await runtime.load(cached.file, {
        contextSize: Math.min(a.contextSize ?? DEFAULT_CONTEXT, MAX_CONTEXT),
        parallel,
        signal,
        gpuIndex: a.gpuIndex,
      });
      const served = new LlamaServedModel(a.model, loaded, {
        parallel,
        queueLimit: this.o.serving?.queueLimit ?? DEFAULT_QUEUE_LIMIT,
      });
      const serving = this.o.serving;
      r.model = served;
      r.adapterHost = {
        load: (adapter, sig) => this.addAdapter(r, served, adapter, sig),
        unload: (name) => served.removeAdapter(name),
      };
      r.release = async () => {
        serving?.http.unserve(a.model, served);
        // Requests being answered finish first; the weights go only once nothing uses them.
        await served.drain();
        await Promise.all(r.leaving.values());
        await loaded.dispose();
      };
      signal.throwIfAborted();
      for (const adapter of r.wanted) await this.addAdapter(r, served, adapter, signal);
      const smoke = await served.smoke({ signal });
      signal.throwIfAborted();
      let report: Served | null = null;
      if (serving) {
        const engineKey = newEngineKey();
        serving.http.serve(served, engineKey);
        const { gpuLayers, totalLayers, vramUsedBytes } = loaded.memory;
        report = { endpoint: serving.endpoint(), engineKey, gpuLayers, totalLayers, vramUsedBytes };
      }
      r.answers = () => served.adapters();
      r.loadNote = `loaded with a ${loaded.context.contextSize}-token context${parallel > 1 ? ` for ${parallel} requests at once` : ''}${cached.reused ? ' (from the cache)' : ''}${placedWords(a)}${loaded.memory.gpuLayers ? `, ${loaded.memory.gpuLayers} of ${loaded.memory.totalLayers} layers on the GPU` : ''}; in-process it made ${smoke.tokens} tokens in ${Math.round(smoke.ms)} ms`;
      this.set(r, 'READY', {
        message: this.messageOf(r),
        smokeText: smoke.text,
        tokensPerSecond: Math.round(smoke.tokensPerSecond * 100) / 100,
        served: report,
      });
    } catch (err) {
      if (signal.aborted) return; // stop() reports what happened
      await r.release?.().catch(() => {});
      r.release = undefined;
      this.set(r, 'FAILED', { message: (err as Error).message ?? String(err) });
    }
  }

  /**
   * Loads one of the model's LoRA adapters: fetched like the weights (sha256 against the mirror's ETag) and
   * smoke-tested in its own context before any request can ask for it. One that fails is refused by name in the
   * message and leaves the base model and the other adapters serving: a bad adapter must not take the model down
   * for every caller who does not use it.
   */
  private async addAdapter(
    r: Replica,
    served: LlamaServedModel,
    adapter: Assignment['adapters'][number],
    signal: AbortSignal,
  ) {
    let file: string;
    try {
      file = (await this.o.cache.fetchModel(new URL(adapter.source, `${this.o.baseUrl}/`).toString(), signal)).file;
    } catch (err) {
      signal.throwIfAborted();
      refuseForNow(this.o, r, adapter, 'was not fetched', (err as Error).message);
      return;
    }
    signal.throwIfAborted();
    try {
      const smoke = await served.addAdapter(adapter.name, file);
      r.refused.delete(adapter.name);
      r.held.set(adapter.name, { source: adapter.source, note: `${adapter.name} (${smoke.tokens} tokens)` });
      this.o.log.info('an adapter is loaded', { replicaId: r.assignment.replicaId, adapter: adapter.name });
    } catch (err) {
      signal.throwIfAborted();
      // The served model's refusal names the adapter and gives llama.cpp's reason.
      const note = (err as Error).message ?? String(err);
      r.refused.set(adapter.name, { source: adapter.source, note });
      this.o.log.warn('an adapter was refused', {
        replicaId: r.assignment.replicaId,
        adapter: adapter.name,
        error: note,
      });
    }
  }

  /**
   * A running replica follows its model's adapters as the assignment lists them: one published after it started
   * is loaded, one withdrawn is unloaded once its requests are done, one published again from another file is
   * replaced. One sync at a time per replica; a newer list waits for the running sync and goes next.
   */
  private followAdapters(r: Replica, wanted: Assignment['adapters']) {
    r.wanted = wanted;
    const host = r.adapterHost;
    if (!host) {
      if (r.startedWith || r.noLora) this.noteUnstarted(r);
      return;
    }
    r.syncing ??= (async () => {
      let synced: Assignment['adapters'] | undefined;
      while (synced !== r.wanted && r.state === 'READY' && !r.abort.signal.aborted) {
        synced = r.wanted;
        await this.syncAdapters(r, host, synced);
      }
    })()
      .catch((err) => {
        if (!r.abort.signal.aborted)
          this.o.log.error('following the adapters failed', { replicaId: r.assignment.replicaId, error: err });
      })
      .finally(() => {
        r.syncing = undefined;
      });
  }

  private async syncAdapters(r: Replica, host: AdapterHost, wanted: Assignment['adapters']) {
    const signal = r.abort.signal;
    const want = new Map(wanted.map((a) => [a.name, a.source]));
    const now = Date.now();
    let changed = false;
    for (const [name, x] of r.refused)
      if (want.get(name) !== x.source || (x.until !== undefined && x.until <= now)) {
        r.refused.delete(name);
        changed = true;
      }
    for (const [name, x] of r.held) {
      if (want.get(name) === x.source) continue;
      r.held.delete(name);
      changed = true;
      this.o.log.info(want.has(name) ? 'an adapter is replaced: published again' : 'an adapter is unloaded', {
        replicaId: r.assignment.replicaId,
        adapter: name,
      });
      // New requests for it are refused at once (and the report below says so), those running finish first.
      const leaving = host
        .unload(name)
        .catch((err) => {
          this.o.log.warn('unloading an adapter did not go cleanly', {
            replicaId: r.assignment.replicaId,
            adapter: name,
            error: err,
          });
        })
        .finally(() => {
          if (r.leaving.get(name) === leaving) r.leaving.delete(name);
        });
      r.leaving.set(name, leaving);
    }
    if (changed) this.adaptersChanged(r);
    for (const adapter of wanted) {
      if (r.held.has(adapter.name) || r.refused.has(adapter.name)) continue;
      // Republished: the old file goes first (its requests finishing), as both cannot hold one name. A stop
      // does not wait for those requests here: releasing the replica drains them.
      const leaving = r.leaving.get(adapter.name);
      if (leaving) await Promise.race([leaving, aborted(signal)]);
      if (signal.aborted) return;
      await host.load(adapter, signal);
      this.adaptersChanged(r);
    }
  }

  /** Says what the replica holds now: its message, its memory and the adapters it answers for, reported. */
  private adaptersChanged(r: Replica) {
    if (r.state !== 'READY' || r.abort.signal.aborted) return;
    if (r.served && r.model) r.served = { ...r.served, vramUsedBytes: r.model.loaded.memory.vramUsedBytes };
    this.set(r, 'READY', { message: this.messageOf(r) });
  }

  /**
   * llama-server serves the adapters it was started with: one published since is named in its message,
   * truthfully, as served from its next start, not now. vLLM that refused LoRA serves none of them.
   */
  private noteUnstarted(r: Replica) {
    const message = this.messageOf(r);
    if (message !== r.message) this.set(r, 'READY', { message });
  }

  /** The load as it was said, then each of the assigned adapters: loaded (with its smoke tokens) or refused and why. */
  private messageOf(r: Replica): string {
    if (r.noLora)
      return r.wanted.length
        ? `${r.loadNote}; adapters ${r.wanted.map((a) => `"${a.name}"`).join(', ')} are not served: vLLM would not start with LoRA enabled for this model (${r.noLora}), so it serves the base model alone`
        : (r.loadNote ?? '');
    if (r.startedWith) {
      const started = new Map(r.startedWith.map((a) => [a.name, a.source]));
      const later = r.wanted.filter((a) => started.get(a.name) !== a.source).map((a) => `"${a.name}"`);
      return later.length
        ? `${r.loadNote}; adapters ${later.join(', ')} were published after it started: it serves them from its next start`
        : (r.loadNote ?? '');
    }
    const said = r.wanted.flatMap((a) => {
      const x = r.held.get(a.name) ?? r.refused.get(a.name);
      return x && x.source === a.source ? [x.note] : [];
    });
    return `${r.loadNote ?? ''}${said.length ? `; adapters: ${said.join(', ')}` : ''}`;
  }

  private stop(r: Replica, why: string): Promise<void> {
    r.stopping ??= (async () => {
      r.abort.abort(new Error('the replica was stopped'));
      await r.starting?.catch(() => {});
      // An adapter being loaded finishes (or is refused) before the weights under it go.
      await r.syncing?.catch(() => {});
      try {
        await r.release?.();
      } catch (err) {
        this.o.log.warn('stopping a replica did not go cleanly', {
          replicaId: r.assignment.replicaId,
          error: err,
        });
      }
      r.release = undefined;
      this.set(r, 'STOPPED', { message: why, smokeText: null, tokensPerSecond: null, served: null });
      r.stopping = undefined;
    })();
    return r.stopping;
  }

  private set(
    r: Replica,
    state: ReplicaState,
    o: Partial<Pick<Replica, 'message' | 'smokeText' | 'tokensPerSecond' | 'served'>>,
  ) {
    r.state = state;
    if (o.served !== undefined) r.served = o.served;
    if (o.message !== undefined) r.message = o.message;
    if (o.smokeText !== undefined) r.smokeText = o.smokeText;
    if (o.tokensPerSecond !== undefined) r.tokensPerSecond = o.tokensPerSecond;
    r.version++;
    const fields = { replicaId: r.assignment.replicaId, model: r.assignment.model, message: r.message };
    if (state === 'FAILED') this.o.log.warn('a replica failed', fields);
    else this.o.log.info(`a replica is ${state.toLowerCase()}`, { ...fields, tokensPerSecond: r.tokensPerSecond });
    void this.send(r);
  }

  /** Sends the latest state of a replica until the control plane has it; later versions win. */
  private send(r: Replica): Promise<void> {
    r.sending ??= (async () => {
      while (r.reported !== r.version) {
        const version = r.version;
        try {
          await this.o.controlPlane.reportReplica({
            replicaId: r.assignment.replicaId,
            state: r.state,
            message: r.message,
            smokeText: r.smokeText,
            tokensPerSecond: r.tokensPerSecond,
            // The key travels with the READY report only, over the node's authenticated channel; never logged.
            ...(r.state === 'READY' && r.served ? r.served : {}),
            adapters: r.state === 'READY' ? r.answers() : [],
          });
          r.reported = version;
        } catch (err) {
          if (err instanceof ControlPlaneError && err.kind === 'refused') {
            // Asking again gets the same answer: log it and take it as delivered.
            this.o.log.warn('the control plane refused a replica report', {
              replicaId: r.assignment.replicaId,
              state: r.state,
              error: err.message,
            });
            r.reported = version;
          } else {
            break; // sent again at the next poll
          }
        }
      }
    })().finally(() => {
      r.sending = undefined;
      if (r.forget && r.state === 'STOPPED' && r.reported === r.version && !r.stopping)
        this.replicas.delete(r.assignment.replicaId);
    });
    return r.sending;
  }

  private async flush() {
    await Promise.all([...this.replicas.values()].filter((r) => r.reported !== r.version).map((r) => this.send(r)));
  }

  /**
   * Stops every replica and reports them STOPPED, for SIGTERM: a node going down for maintenance should not
   * leave the control plane counting replicas that are gone. Reports get `reportMs` to get through.
   */
  async stopAll(reportMs = 5000) {
    this.closed = true;
    clearTimeout(this.timer);
    this.unpush?.();
    await this.polling?.catch(() => {});
    // A failed replica keeps its FAILED and its reason: that is what the operator needs to see.
    const active = [...this.replicas.values()].filter((r) => r.state === 'LOADING' || r.state === 'READY');
    await Promise.all(active.map((r) => this.stop(r, 'stopped: the node agent was shut down')));
    // The wait ends with the reports, so that no timer holds the agent's exit for the rest of it.
    const flushed = new AbortController();
    await Promise.race([this.flush(), sleep(reportMs, flushed.signal).catch(() => {})]);
    flushed.abort();
  }
}
