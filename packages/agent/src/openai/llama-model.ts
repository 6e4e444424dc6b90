import type { ChatHistoryItem, ChatWrapper, LlamaContextSequence, LlamaModel, Token } from 'node-llama-cpp';
import type { LoadedModel, SequencePool, SmokeResult } from '../llama-runtime.js';
import { type Embedded, EngineError, type Generated, type GenerateInput, type ServedModel } from './engine.js';
import { beginningToken, chatHistory } from './llama-prompt.js';

// A llama.cpp replica as its node serves it (the ServedModel of engine.ts): `parallel` sequences of one context
// generate at once, for the base model and for each adapter's context alike, and further requests wait in one
// bounded first-come queue. A request takes the free sequence whose KV state shares the longest start with its own
// prompt (llama-runtime.ts SequencePool) and computes only the tokens after it, which it reports as OpenAI's
// `cached_tokens`; nothing else of an earlier request is read. How a request's messages become node-llama-cpp's
// chat history is in llama-prompt.ts.

export type LlamaServedModelOptions = {
  /** Requests generated at once per context; at most the `parallel` the model was loaded with. */
  parallel: number;
  /** Requests that may wait for a sequence, over the base and all adapters; one more is refused as busy. */
  queueLimit: number;
  /** Whether /v1/embeddings works; by default decided from the GGUF (see makesEmbeddings). */
  embeddings?: boolean;
};

/** The smoke test through the same path as every request, with the time to the first piece of text. */
export type ServedSmoke = SmokeResult & { firstTokenMs: number };

type Waiter = {
  pool: SequencePool;
  /** The prompt's tokens: the sequence handed over is the free one sharing most of them. */
  tokens: readonly Token[];
  signal: AbortSignal;
  resolve: (sequence: LlamaContextSequence) => void;
  reject: (err: unknown) => void;
  onAbort: () => void;
};

// Architectures that only encode: they make embeddings and cannot generate.
const ENCODERS = new Set([
  'bert',
  'modern-bert',
  'nomic-bert',
  'nomic-bert-moe',
  'neo-bert',
  'jina-bert-v2',
  'jina-bert-v3',
  'eurobert',
  't5encoder',
]);
const POOLING_RANK = 4; // a reranker's pooling: it scores pairs, its output is no embedding

/**
 * Whether a model makes embeddings, from its GGUF: an encoder architecture, or a pooling type the converter
 * wrote (embedding models built on decoders, such as Qwen3-Embedding, carry one; chat models carry none).
 */
export function makesEmbeddings(model: LlamaModel): boolean {
  const metadata = model.fileInfo.metadata as unknown as Record<string, Record<string, unknown> | undefined>;
  const architecture = String(metadata.general?.architecture ?? '');
  const pooling = metadata[architecture]?.pooling_type;
  if (typeof pooling === 'number') return pooling > 0 && pooling !== POOLING_RANK;
  return ENCODERS.has(architecture) || (model.fileInsights.hasEncoder && !model.fileInsights.hasDecoder);
}

export class LlamaServedModel implements ServedModel {
  readonly embeddings: boolean;
  private readonly parallel: number;
  private readonly waiting: Waiter[] = [];
  /** Adapters being unloaded: no new request may take them, those running finish. */
  private readonly leaving = new Set<string>();
  private chatWrapper: ChatWrapper | undefined;
  private stopping: string | undefined;

  constructor(
    readonly name: string,
    readonly loaded: LoadedModel,
    private readonly o: LlamaServedModelOptions,
  ) {
    if (!(o.parallel >= 1) || o.parallel > loaded.parallel)
      throw new Error(
        `parallel is 1 to the ${loaded.parallel} sequences the model was loaded with, not ${o.parallel}: load it with parallel: ${o.parallel}`,
      );
    if (!(o.queueLimit >= 0)) throw new Error(`queueLimit is 0 or more, not ${o.queueLimit}`);
    this.parallel = Math.floor(o.parallel);
    this.embeddings = o.embeddings ?? makesEmbeddings(loaded.model);
  }

  adapters(): string[] {
    return [...this.loaded.adapters.keys()].filter((a) => !this.leaving.has(a));
  }

  /** Requests generating now, over the base and all adapters. */
  get active(): number {
    let n = this.loaded.pool()?.busy ?? 0;
    for (const a of this.loaded.adapters.keys()) n += this.loaded.pool(a)?.busy ?? 0;
    return n;
  }

  /** Requests waiting for a sequence. */
  get queued(): number {
    return this.waiting.length;
  }

  /**
   * Loads an adapter while the replica serves (one published after it started), smoke-tested before any request
   * can ask for it. A file llama.cpp refuses is refused by name, and the base and other adapters keep serving.
   */
  async addAdapter(name: string, file: string): Promise<SmokeResult> {
    if (this.leaving.has(name))
      throw new Error(`adapter "${name}" is still being unloaded from ${this.name}: add it again once that is done`);
    try {
      return await this.loaded.addAdapter(name, file);
    } catch (err) {
      throw new Error(
        `adapter "${name}" did not load on ${this.name}: ${(err as Error).message ?? err}; the base model keeps serving`,
      );
    }
  }

  /** Unloads an adapter: new requests for it are refused at once, those running finish first. */
  async removeAdapter(name: string) {
    const pool = this.loaded.pool(name);
    if (!pool || this.leaving.has(name)) return;
    this.leaving.add(name);
    for (const w of this.waiting.filter((w) => w.pool === pool)) {
      this.waiting.splice(this.waiting.indexOf(w), 1);
      w.signal.removeEventListener('abort', w.onAbort);
      w.reject(unknownAdapter(this.name, name, this.adapters()));
    }
    try {
      await pool.idled();
      await this.loaded.removeAdapter(name);
    } finally {
      this.leaving.delete(name);
    }
  }

  /**
   * Before the replica is unloaded: refuses what waits and what comes, and resolves once the requests generating
   * now are done (abort their signals to end them sooner). Then `loaded.dispose()` cuts nobody off.
   */
  async drain(why = `${this.name} is stopping on this node`) {
    this.stopping = why;
    for (const w of this.waiting.splice(0)) {
      w.signal.removeEventListener('abort', w.onAbort);
      w.reject(new EngineError('busy', `${why}: try again`));
    }
    const pools = [this.loaded.pool(), ...[...this.loaded.adapters.keys()].map((a) => this.loaded.pool(a))];
    await Promise.all(pools.map((p) => p?.idled()));
  }

  async generate(input: GenerateInput): Promise<Generated> {
    if (this.stopping) throw new EngineError('busy', `${this.stopping}: try again`);
    if (this.loaded.model.fileInsights.hasEncoder && !this.loaded.model.fileInsights.hasDecoder)
      throw new EngineError(
        'unsupported',
        `${this.name} is an embedding model: it makes embeddings, not text`,
        'model',
      );
    const pool = this.poolFor(input.adapter);
    // Requests resume from this await in the order they came (one module promise), so the queue's order holds.
    if (input.kind === 'chat')
      this.chatWrapper ??= (await import('node-llama-cpp')).resolveChatWrapper(this.loaded.model);
    const prompt = this.promptOf(input);
    // Taken before the first await: requests are served in the order they arrived.
    const free = this.take(pool, input.signal, prompt.tokens);
    const sequence = free instanceof Promise ? await free : free;
    try {
      return await this.run(sequence, input, prompt);
    } finally {
      // Given back before the answer: the next request finds the sequence free the moment this one is done.
      await pool.give(sequence);
      this.dispatch();
    }
  }

  async embed(input: string[], signal: AbortSignal): Promise<Embedded> {
    if (this.stopping) throw new EngineError('busy', `${this.stopping}: try again`);
    if (!this.embeddings)
      throw new EngineError(
        'unsupported',
        `${this.name} does not make embeddings (its GGUF names no pooling and it is no encoder): ask an embedding model`,
        'model',
      );
    const context = await this.loaded.embeddingContext();
    const limit = this.loaded.context.contextSize;
    const vectors: number[][] = [];
    let promptTokens = 0;
    for (const [i, text] of input.entries()) {
      signal.throwIfAborted();
      const tokens = context.calculateInputLength(text);
      if (tokens >= limit)
        throw new EngineError(
          'bad_request',
          `input ${i} is ${tokens} tokens and ${this.name} embeds at most ${limit - 1}: split it`,
          'input',
        );
      vectors.push([...(await context.getEmbeddingFor(text)).vector]);
      promptTokens += tokens;
    }
    return { vectors, promptTokens };
  }

  /** One short greedy completion through the request path, timed, as the smoke test of a replica or adapter. */
  async smoke(o: { prompt?: string; maxTokens?: number; adapter?: string; signal?: AbortSignal } = {}) {
    const started = performance.now();
    let firstTokenMs: number | undefined;
    const out = await this.generate({
      kind: 'completion',
      prompt: o.prompt ?? 'Hello',
      maxTokens: o.maxTokens ?? 8,
      temperature: 0,
      adapter: o.adapter,
      signal: o.signal ?? new AbortController().signal,
      onText: () => {
        firstTokenMs ??= performance.now() - started;
      },
    });
    const ms = performance.now() - started;
    const tokens = out.completionTokens;
    return {
      text: out.text,
      tokens,
      ms,
      tokensPerSecond: ms > 0 ? (tokens * 1000) / ms : 0,
      firstTokenMs: firstTokenMs ?? ms,
    } satisfies ServedSmoke;
  }

  private poolFor(adapter: string | undefined): SequencePool {
    const pool = adapter === undefined || this.leaving.has(adapter) ? undefined : this.loaded.pool(adapter);
    if (adapter === undefined) return this.loaded.pool()!;
    if (!pool) throw unknownAdapter(this.name, adapter, this.adapters());
    return pool;
  }

  /** A free sequence now, or a promise of one in arrival order; refused as busy past the queue's bound. */
  private take(
    pool: SequencePool,
    signal: AbortSignal,
    tokens: readonly Token[],
  ): LlamaContextSequence | Promise<LlamaContextSequence> {
    signal.throwIfAborted();
    // Someone already waiting for this context goes first.
    if (!this.waiting.some((w) => w.pool === pool)) {
      const sequence = pool.take(this.parallel, tokens);
      if (sequence) return sequence;
    }
    if (this.waiting.length >= this.o.queueLimit)
      throw new EngineError(
        'busy',
        `${this.name} is busy: ${this.parallel} request(s) per context are generating and ${this.waiting.length} are waiting, the most it queues; try again shortly`,
      );
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        pool,
        tokens,
        signal,
        resolve,
        reject,
        onAbort: () => {
          const i = this.waiting.indexOf(waiter);
          if (i >= 0) this.waiting.splice(i, 1);
          reject(signal.reason);
        },
      };
      signal.addEventListener('abort', waiter.onAbort, { once: true });
      this.waiting.push(waiter);
    });
  }

  /** Hands free sequences to the waiters, first come first served within each context. */
  private dispatch() {
    for (let i = 0; i < this.waiting.length; ) {
      const w = this.waiting[i]!;
      let sequence: LlamaContextSequence | undefined;
      try {
        sequence = w.pool.take(this.parallel, w.tokens);
      } catch (err) {
        this.waiting.splice(i, 1);
        w.signal.removeEventListener('abort', w.onAbort);
        w.reject(err);
        continue;
      }
      if (!sequence) {
        i++;
        continue;
      }
      this.waiting.splice(i, 1);
      w.signal.removeEventListener('abort', w.onAbort);
      w.resolve(sequence);
    }
  }

  /** The request's chat history and the tokens it evaluates, worked out before a sequence is taken for it. */
  private promptOf(input: GenerateInput): Prompt {
    const model = this.loaded.model;
    if (input.kind === 'chat') {
      const history = chatHistory(input.messages);
      const wrapper = this.chatWrapper;
      if (!wrapper) throw new Error('the chat wrapper is resolved before a chat prompt is tokenized (generate)');
      // What LlamaChat evaluates: the rendered template with the model's turn opened.
      const tokens = wrapper
        .generateContextState({ chatHistory: [...history, { type: 'model', response: [] }] })
        .contextText.tokenize(model.tokenizer);
      return { history, tokens };
    }
    const bos = beginningToken(model);
    const tokens = model.tokenize(input.prompt, false, bos ? 'trimLeadingSpace' : undefined);
    if (bos) tokens.unshift(bos);
    if (tokens.length === 0)
      throw new EngineError(
        'bad_request',
        'the prompt is empty and this model has no BOS token to start from',
        'prompt',
      );
    return { history: [], tokens };
  }

  private async run(sequence: LlamaContextSequence, input: GenerateInput, prompt: Prompt): Promise<Generated> {
    const { LlamaChat, LlamaCompletion } = await import('node-llama-cpp');
    const contextSize = sequence.context.contextSize;
    const meter = sequence.tokenMeter.getState();
    const { history } = prompt;
    const promptTokens = prompt.tokens.length;
    // What the sequence already holds of this prompt is not evaluated again (at least the last token is: it gives
    // the first answer token's logits), as llama-server counts its cached tokens.
    const cachedTokens = Math.max(
      0,
      Math.min(sequence.compareContextTokens(prompt.tokens as Token[]).firstDifferentIndex, promptTokens - 1),
    );
    // One token of room is kept: LlamaChat would otherwise shift the context, silently dropping earlier turns.
    const room = contextSize - promptTokens - 1;
    if (room < 1)
      throw new EngineError(
        'too_long',
        `the prompt is ${promptTokens} tokens and ${this.name} holds ${contextSize} per request, the answer included: shorten it`,
        input.kind === 'chat' ? 'messages' : 'prompt',
      );
    const maxTokens = Math.min(Math.max(1, input.maxTokens ?? room), room);
    const sampling = {
      signal: input.signal,
      maxTokens,
      // OpenAI's defaults: temperature 1, top_p 1, no repetition penalty.
      temperature: input.temperature ?? 1,
      topP: input.topP,
      seed: input.seed,
      repeatPenalty: false as const,
      trimWhitespaceSuffix: false,
      customStopTriggers: input.stop?.length ? input.stop : undefined,
      onTextChunk: input.onText,
    };
    let text: string;
    let stopReason: string;
    if (input.kind === 'chat') {
      const chat = new LlamaChat({ contextSequence: sequence, chatWrapper: this.chatWrapper! });
      try {
        const res = await chat.generateResponse(history, sampling);
        text = res.response;
        stopReason = res.metadata.stopReason;
      } finally {
        chat.dispose({ disposeSequence: false });
      }
    } else {
      const completion = new LlamaCompletion({ contextSequence: sequence });
      try {
        const res = await completion.generateCompletionWithMeta(input.prompt, {
          ...sampling,
          disableContextShift: true,
          contextShiftSize: 0,
        });
        text = res.response;
        stopReason = res.metadata.stopReason;
      } finally {
        completion.dispose({ disposeSequence: false });
      }
    }
    return {
      text,
      finishReason: stopReason === 'maxTokens' ? 'length' : 'stop',
      promptTokens,
      cachedTokens,
      // Every token sampled, those of a stop string and the end-of-turn token included: node-llama-cpp's meter
      // counts one output per evaluation that asked for logits, which is one per sampled token.
      completionTokens: sequence.tokenMeter.getState().usedOutputTokens - meter.usedOutputTokens,
    };
  }
}

type Prompt = { history: ChatHistoryItem[]; tokens: Token[] };

function unknownAdapter(model: string, adapter: string, loaded: string[]) {
  return new EngineError(
    'unknown_adapter',
    `${model} has no adapter "${adapter}" loaded here; it has ${loaded.length ? loaded.map((a) => `"${a}"`).join(', ') : 'none'}`,
    'model',
  );
}
