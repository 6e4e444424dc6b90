import type { Llama, LlamaContext, LlamaModel } from 'node-llama-cpp';
import type { Logger } from '../lib/log.js';

// llama.cpp in the agent's own process, through node-llama-cpp's prebuilt binaries. On CPU: the prebuilt CPU
// binary is the one installed (pnpm-workspace.yaml leaves out the CUDA, Vulkan and other builds), and it loads
// in well under a second with nothing downloaded or compiled.

export type SmokeResult = { text: string; tokens: number; ms: number; tokensPerSecond: number };

export type LlamaRuntimeOptions = {
  /** CPU threads per context; default the cores llama.cpp finds useful for math. */
  threads?: number;
  log?: Logger;
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

  /** Starts llama.cpp on CPU; throws with node-llama-cpp's reason when this machine cannot run it. */
  static async create(o: LlamaRuntimeOptions = {}): Promise<LlamaRuntime> {
    const { getLlama, LlamaLogLevel } = await import('node-llama-cpp');
    let runtime: LlamaRuntime | undefined;
    const llama = await getLlama({
      gpu: false,
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

  /** The llama.cpp release bundled with node-llama-cpp, e.g. "b4748" or "v0.5.0". */
  get release(): string {
    return this.llama.llamaCppRelease.release;
  }

  private remember(line: string) {
    this.recent.push({ n: this.lines++, line });
    if (this.recent.length > 50) this.recent.shift();
  }

  /**
   * Loads a GGUF with a context of `contextSize` tokens. Throws with llama.cpp's own reason on failure. One load
   * at a time: loads compete for the same disk and memory, and llama.cpp's log lines then belong to one file.
   */
  load(file: string, o: { contextSize: number; signal?: AbortSignal }): Promise<LoadedModel> {
    const next = this.queue.then(() => this.loadNow(file, o));
    this.queue = next.then(
      () => {},
      () => {},
    );
    return next;
  }

  private async loadNow(file: string, o: { contextSize: number; signal?: AbortSignal }): Promise<LoadedModel> {
    o.signal?.throwIfAborted();
    const mark = this.lines;
    let model: LlamaModel | undefined;
    try {
      model = await this.llama.loadModel({ modelPath: file, loadSignal: o.signal });
      const context = await model.createContext({
        // Past what the model was trained on, llama.cpp warns and the output degrades: never ask for more.
        contextSize: model.trainContextSize > 0 ? Math.min(o.contextSize, model.trainContextSize) : o.contextSize,
        sequences: 1,
        threads: this.threads,
        createSignal: o.signal,
      });
      return new LoadedModel(model, context);
    } catch (err) {
      await model?.dispose().catch(() => {});
      // llama.cpp's log lines reach JavaScript through the event loop, after the failure itself.
      await new Promise((r) => setTimeout(r, 50));
      // "Failed to load model" alone tells the operator nothing; llama.cpp logged why just before.
      const said = this.recent
        .filter((r) => r.n >= mark && /error|invalid|corrupt/i.test(r.line))
        .map((r) => r.line.replace(/^llama_model_load: /, ''));
      const message = (err as Error).message ?? String(err);
      throw new Error(said.length ? `${message}: ${said.join('; ')}` : message);
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

/** A model and its context, kept loaded while the replica runs; and a context per LoRA adapter. */
export class LoadedModel {
  /** By adapter name: llama.cpp applies an adapter to a whole context, so each gets its own over the shared weights. */
  readonly adapters = new Map<string, LlamaContext>();

  constructor(
    readonly model: LlamaModel,
    readonly context: LlamaContext,
  ) {}

  /** Loads a GGUF LoRA adapter into a context of its own (scale 1) and proves it generates. */
  async addAdapter(name: string, file: string): Promise<SmokeResult> {
    const context = await this.model.createContext({
      contextSize: this.context.contextSize,
      sequences: 1,
      lora: { adapters: [{ filePath: file, scale: 1 }] },
    });
    this.adapters.set(name, context);
    return smokeOn(context);
  }

  /**
   * One short greedy completion, timed: proof that the weights produce tokens, and the speed an operator can
   * compare across nodes. Tokens per second counts the prompt's evaluation too, as a first request would.
   */
  smoke(o: { prompt?: string; maxTokens?: number } = {}): Promise<SmokeResult> {
    return smokeOn(this.context, o);
  }

  async dispose() {
    for (const c of this.adapters.values()) await c.dispose();
    this.adapters.clear();
    await this.context.dispose();
    await this.model.dispose();
  }
}

async function smokeOn(context: LlamaContext, o: { prompt?: string; maxTokens?: number } = {}): Promise<SmokeResult> {
  const { LlamaCompletion } = await import('node-llama-cpp');
  const sequence = context.getSequence();
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
    return { text, tokens, ms, tokensPerSecond: ms > 0 ? (tokens * 1000) / ms : 0 };
  } finally {
    sequence.dispose();
  }
}
