import type { Logger } from '@hangar/common/log';
import { sleep } from '@hangar/common/retry';
import type {
  Llama,
  LlamaContext,
  LlamaContextSequence,
  LlamaEmbeddingContext,
  LlamaModel,
  Token,
} from 'node-llama-cpp';

// llama.cpp in the agent's own process, through node-llama-cpp's prebuilt binaries. The CPU prebuilt is the one
// installed (pnpm-workspace.yaml leaves out the CUDA, Vulkan and other builds), and it loads in well under a
// second with nothing downloaded or compiled. With `gpu: 'auto'` a node that has the CUDA prebuilt installed uses
// its GPU; one without it falls back to the CPU build, which `gpu` then says.

export type SmokeResult = { text: string; tokens: number; ms: number; tokensPerSecond: number };

export type LlamaRuntimeOptions = {
  /** CPU threads per context; default the cores llama.cpp finds useful for math. */
  threads?: number;
  /**
   * 'auto': the best GPU build node-llama-cpp finds installed (CUDA, then Vulkan), else the CPU. Default false:
   * CPU only, so a machine with a GPU driver but no GPU build behaves the same as one without.
   */
  gpu?: 'auto' | false;
  log?: Logger;
};

export type LoadOptions = {
  /** Tokens of context per sequence (each concurrent request has its own). */
  contextSize: number;
  /** Sequences in each context: how many requests generate at once. Default 1. */
  parallel?: number;
  /** Layers offloaded to the GPU: a number the placement decided, or node-llama-cpp's 'auto' (default) or 'max'. */
  gpuLayers?: number | 'auto' | 'max';
  /**
   * The GPU placement chose. node-llama-cpp 3.22 has no per-model device choice (its one llama.cpp uses the
   * process's devices), so the embedded runtime takes it as said and the message names it; a replica that must
   * sit on its card alone runs under HANGAR_AGENT_LLAMA_SERVER, which gets CUDA_VISIBLE_DEVICES.
   */
  gpuIndex?: number | null;
  signal?: AbortSignal;
  /** Whether sequences keep their KV state for the next request (default true); off only to measure what it saves. */
  promptReuse?: boolean;
};

/** What a loaded replica really holds, measured after loading, for the control plane to set beside its estimate. */
export type ModelMemory = {
  /** The GPU build in use ('cuda', 'vulkan', 'metal'), or false on the CPU. */
  gpu: string | false;
  /** Layers on the GPU, of `totalLayers`. */
  gpuLayers: number;
  totalLayers: number;
  /** Free GPU memory before the load less free memory after it (weights, contexts, adapters); 0 on the CPU. */
  vramUsedBytes: number;
};

/** One llama.cpp for the process; each replica is a model and a context loaded from it. */
export class LlamaRuntime {
  /** Recent llama.cpp log lines, so a failed load can say what llama.cpp said rather than "Failed to load". */
  private readonly recent: { n: number; line: string }[] = [];
  private lines = 0;
  private queue: Promise<void> = Promise.resolve();

  private constructor(
    private readonly llama: Llama,
    private readonly threads: number,
    private readonly log: Logger | undefined,
  ) {}

  /** Starts llama.cpp (on the CPU unless `gpu: 'auto'`); throws with node-llama-cpp's reason when it cannot run. */
  static async create(o: LlamaRuntimeOptions = {}): Promise<LlamaRuntime> {
    const { getLlama, LlamaLogLevel } = await import('node-llama-cpp');
    let runtime: LlamaRuntime | undefined;
    const llama = await getLlama({
      gpu: o.gpu ?? false,
      // Never compile llama.cpp on a node: it has no toolchain to spare, and a failed build would take minutes
      // to say what "no prebuilt binary for this platform" says at once.
      build: 'never',
      logLevel: LlamaLogLevel.warn,
      logger: (level, message) => {
        const line = message.trim();
        if (!line) return;
        runtime?.remember(line);
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) o.log?.warn('llama.cpp', { line });
        else o.log?.debug('llama.cpp', { line });
      },
    });
    runtime = new LlamaRuntime(llama, o.threads ?? llama.cpuMathCores, o.log);
    return runtime;
  }

  /** The GPU build llama.cpp runs on ('cuda', 'vulkan', 'metal'), or false on the CPU. */
  get gpu(): string | false {
    return this.llama.gpu;
  }

  /** The llama.cpp release bundled with node-llama-cpp, e.g. "b4748" or "v0.5.0". */
  get release(): string {
    return this.llama.llamaCppRelease.release;
  }

  private remember(line: string) {
    this.recent.push({ n: this.lines++, line });
    if (this.recent.length > 50) this.recent.shift();
  }

  /**
   * Loads a GGUF with a context of `parallel` sequences of `contextSize` tokens each. Throws with llama.cpp's own
   * reason on failure. One load at a time: loads compete for the same disk and memory, llama.cpp's log lines then
   * belong to one file, and the free GPU memory measured before and after is this load's alone.
   */
  load(file: string, o: LoadOptions): Promise<LoadedModel> {
    return this.exclusive(() => this.loadNow(file, o));
  }

  /**
   * Runs one load (a model, or an adapter's context) after the ones before it, and gives a failure llama.cpp's
   * own reason: "Failed to load model" alone tells the operator nothing; llama.cpp logged why just before.
   */
  private exclusive<T>(run: () => Promise<T>): Promise<T> {
    const next = this.queue.then(async () => {
      const mark = this.lines;
      try {
        return await run();
      } catch (err) {
        // llama.cpp's log lines reach JavaScript through the event loop, after the failure itself.
        await sleep(50);
        const said = this.recent
          .filter((r) => r.n >= mark && /error|invalid|corrupt/i.test(r.line))
          .map((r) => r.line.replace(/^llama_model_load: /, ''));
        const message = (err as Error).message ?? String(err);
        throw new Error(said.length ? `${message}: ${said.join('; ')}` : message);
      }
    });
    this.queue = next.then(
      () => {},
      () => {},
    );
    return next;
  }

  private async loadNow(file: string, o: LoadOptions): Promise<LoadedModel> {
    o.signal?.throwIfAborted();
    const parallel = Math.max(1, Math.floor(o.parallel ?? 1));
    let model: LlamaModel | undefined;
    try {
      const before = await this.llama.getVramState();
      model = await this.llama.loadModel({ modelPath: file, loadSignal: o.signal, gpuLayers: o.gpuLayers });
      const context = await model.createContext({
        // Past what the model was trained on, llama.cpp warns and the output degrades: never ask for more.
        contextSize: model.trainContextSize > 0 ? Math.min(o.contextSize, model.trainContextSize) : o.contextSize,
        sequences: parallel,
        threads: this.threads,
        createSignal: o.signal,
      });
      const after = await this.llama.getVramState();
      return new LoadedModel(model, context, {
        parallel,
        promptReuse: o.promptReuse,
        threads: this.threads,
        memory: {
          gpu: this.llama.gpu,
          gpuLayers: model.gpuLayers,
          totalLayers: model.fileInsights.totalLayers,
          vramUsedBytes: Math.max(0, before.free - after.free),
        },
        exclusive: (run) => this.exclusive(run),
        freeVram: async () => (await this.llama.getVramState()).free,
      });
    } catch (err) {
      await model?.dispose().catch(() => {});
      throw err;
    }
  }

  /**
   * Ends llama.cpp, waiting at most `waitMs`. node-llama-cpp 3.22.1 keeps a hold on the Llama for each model
   * whose load failed, and that hold is lost, never released, once the failed model is garbage-collected; its
   * dispose() then waits forever. The agent is exiting when it calls this, and exiting frees what is left.
   */
  async dispose(waitMs = 3000) {
    let timer: NodeJS.Timeout | undefined;
    const done = await Promise.race([
      this.llama.dispose().then(() => true),
      new Promise<false>((resolve) => {
        timer = setTimeout(() => resolve(false), waitMs);
      }),
    ]);
    clearTimeout(timer);
    if (!done) this.log?.warn('llama.cpp did not finish disposing (a failed load holds it); leaving it to the exit');
  }
}

export type LoadedModelOptions = {
  /** Sequences in each context (the base's and every adapter's): requests that generate at once. */
  parallel?: number;
  threads?: number;
  memory?: ModelMemory;
  /** The runtime's one-at-a-time lane, so an adapter's memory is measured alone and its failure explained. */
  exclusive?: <T>(run: () => Promise<T>) => Promise<T>;
  freeVram?: () => Promise<number>;
  /** Whether a sequence keeps its KV state for the next request to reuse (default true; off only to measure it). */
  promptReuse?: boolean;
};

/**
 * The sequences of one context, each kept and reused across requests (a disposed sequence returns to llama.cpp only
 * later, under the context's lock, and the next request waiting for it would find "No sequences left" in between).
 * As llama-server's slots do, a sequence given back keeps its KV state, and a request takes the free one whose state
 * shares the longest start with its own prompt: turn 2 of a conversation, or a request with a known system prompt,
 * computes only the tokens after what is shared. Nothing of another request is read: node-llama-cpp keeps the
 * matching tokens and erases the rest before evaluating (LlamaContextSequence.adaptStateToTokens); what another
 * caller could learn is timing, which the gateway's routing keeps within one caller's scope (gateway/affinity.ts).
 */
export class SequencePool {
  private readonly idle: LlamaContextSequence[] = [];
  private made = 0;
  private readonly whenIdle: (() => void)[] = [];

  constructor(
    readonly context: LlamaContext,
    readonly size: number,
    /** Whether state is kept between requests (LoadedModelOptions.promptReuse). */
    readonly reuse = true,
  ) {}

  /** Sequences generating now. */
  get busy(): number {
    return this.made - this.idle.length;
  }

  /**
   * A free sequence, if fewer than `limit` (at most `size`) are busy; never waits. With the prompt's `tokens`: the
   * free one holding the longest start of them; else a new one while the context has room (the others' states
   * stay); else the one used longest ago.
   */
  take(limit = this.size, tokens?: readonly Token[]): LlamaContextSequence | undefined {
    if (this.busy >= Math.min(limit, this.size)) return undefined;
    let best = -1;
    let longest = 0;
    if (tokens)
      for (const [i, sequence] of this.idle.entries()) {
        const shared = sequence.compareContextTokens(tokens as Token[]).firstDifferentIndex;
        if (shared > longest) {
          longest = shared;
          best = i;
        }
      }
    if (best >= 0) return this.idle.splice(best, 1)[0];
    if (this.made >= this.size) return this.idle.shift();
    this.made++;
    try {
      return this.context.getSequence();
    } catch (err) {
      this.made--;
      throw err;
    }
  }

  /** Makes the sequence free again, its state kept for reuse (or drops it, when its context has gone). */
  async give(sequence: LlamaContextSequence) {
    try {
      if (!this.reuse || sequence.disposed) await sequence.clearHistory();
      this.idle.push(sequence);
    } catch {
      // Its context is being disposed (the replica is stopping): the sequence goes with it.
      if (!sequence.disposed) sequence.dispose();
      this.made--;
    }
    if (this.busy === 0) for (const resolve of this.whenIdle.splice(0)) resolve();
  }

  /** Resolves once no sequence is busy. */
  idled(): Promise<void> {
    return this.busy === 0 ? Promise.resolve() : new Promise((resolve) => this.whenIdle.push(resolve));
  }
}

/** A model and its context, kept loaded while the replica runs; and a context per LoRA adapter. */
export class LoadedModel {
  /** By adapter name: llama.cpp applies an adapter to a whole context, so each gets its own over the shared weights. */
  readonly adapters = new Map<string, LlamaContext>();
  /** Sequences in each context: how many requests generate at once, per adapter and for the base. */
  readonly parallel: number;
  /** What the replica holds, measured at load and grown by each adapter's context. */
  readonly memory: ModelMemory;
  private readonly pools = new WeakMap<LlamaContext, SequencePool>();
  private embedding: Promise<LlamaEmbeddingContext> | undefined;

  constructor(
    readonly model: LlamaModel,
    readonly context: LlamaContext,
    private readonly o: LoadedModelOptions = {},
  ) {
    this.parallel = o.parallel ?? 1;
    this.memory = o.memory ?? {
      gpu: false,
      gpuLayers: model.gpuLayers,
      totalLayers: model.fileInsights.totalLayers,
      vramUsedBytes: 0,
    };
  }

  /** The sequences of the base context, or of an adapter's (undefined when no such adapter is loaded). */
  pool(adapter?: string): SequencePool | undefined {
    const context = adapter === undefined ? this.context : this.adapters.get(adapter);
    if (!context) return undefined;
    let pool = this.pools.get(context);
    if (!pool) {
      pool = new SequencePool(context, this.parallel, this.o.promptReuse ?? true);
      this.pools.set(context, pool);
    }
    return pool;
  }

  /**
   * Loads a GGUF LoRA adapter into a context of its own (scale 1, `parallel` sequences) and proves it generates;
   * only then can requests ask for it. Throws llama.cpp's reason, and leaves nothing behind, when it does not load.
   */
  addAdapter(name: string, file: string): Promise<SmokeResult> {
    const run = async () => {
      if (this.adapters.has(name)) throw new Error(`an adapter named "${name}" is already loaded on this replica`);
      const before = await this.o.freeVram?.();
      const context = await this.model.createContext({
        contextSize: this.context.contextSize,
        sequences: this.parallel,
        threads: this.o.threads,
        lora: { adapters: [{ filePath: file, scale: 1 }] },
      });
      try {
        const pool = new SequencePool(context, this.parallel, this.o.promptReuse ?? true);
        this.pools.set(context, pool);
        const smoke = await smokeOn(pool);
        const after = await this.o.freeVram?.();
        if (before !== undefined && after !== undefined) this.memory.vramUsedBytes += Math.max(0, before - after);
        this.adapters.set(name, context);
        return smoke;
      } catch (err) {
        await context.dispose().catch(() => {});
        throw err;
      }
    };
    return this.o.exclusive ? this.o.exclusive(run) : run();
  }

  /** Unloads an adapter's context; the caller makes sure no request is using it. */
  async removeAdapter(name: string) {
    const context = this.adapters.get(name);
    if (!context) return;
    this.adapters.delete(name);
    await context.dispose();
  }

  /**
   * A context that makes embeddings, made on first use: one per model, requests taking turns on it (node-llama-cpp
   * evaluates one input at a time). Its batch is the whole context, as llama.cpp's non-causal models need.
   */
  embeddingContext(): Promise<LlamaEmbeddingContext> {
    this.embedding ??= this.model
      .createEmbeddingContext({
        contextSize: this.context.contextSize,
        batchSize: this.context.contextSize,
        threads: this.o.threads,
      })
      .catch((err) => {
        this.embedding = undefined;
        throw err;
      });
    return this.embedding;
  }

  /**
   * One short greedy completion, timed: proof that the weights produce tokens, and the speed an operator can
   * compare across nodes. Tokens per second counts the prompt's evaluation too, as a first request would. It
   * takes a sequence of the base context: while requests are served, smoke through LlamaServedModel.smoke.
   */
  smoke(o: { prompt?: string; maxTokens?: number } = {}): Promise<SmokeResult> {
    return smokeOn(this.pool()!, o);
  }

  async dispose() {
    const embedding = this.embedding;
    this.embedding = undefined;
    await embedding?.then((c) => c.dispose()).catch(() => {});
    for (const c of this.adapters.values()) await c.dispose();
    this.adapters.clear();
    await this.context.dispose();
    await this.model.dispose();
  }
}

async function smokeOn(pool: SequencePool, o: { prompt?: string; maxTokens?: number } = {}): Promise<SmokeResult> {
  const { LlamaCompletion } = await import('node-llama-cpp');
  const sequence = pool.take();
  if (!sequence) throw new Error('every sequence of this model is generating: smoke-test it through its served model');
  try {
    const completion = new LlamaCompletion({ contextSequence: sequence });
    let tokens = 0;
    const started = performance.now();
    const text = await completion.generateCompletion(o.prompt ?? 'Hello', {
      maxTokens: o.maxTokens ?? 8,
      temperature: 0,
      onToken: (t) => {
        tokens += t.length;
      },
    });
    const ms = performance.now() - started;
    completion.dispose({ disposeSequence: false });
    return { text, tokens, ms, tokensPerSecond: ms > 0 ? (tokens * 1000) / ms : 0 };
  } finally {
    await pool.give(sequence);
  }
}
