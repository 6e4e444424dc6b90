// The seam between the agent's OpenAI-compatible HTTP layer (http.ts) and what generates tokens (llama-model.ts
// for the embedded llama.cpp). The HTTP layer speaks OpenAI's protocol exactly and knows nothing of llama.cpp;
// a served model knows nothing of HTTP. Both sides are tested on their own and together.

export type ChatRole = 'system' | 'developer' | 'user' | 'assistant' | 'tool';
export type ChatMessage = { role: ChatRole; content: string };

/** OpenAI's sampling fields, already validated; absent means the engine's default. */
export type Sampling = {
  maxTokens?: number;
  temperature?: number;
  topP?: number;
  seed?: number;
  /** Up to 4 strings, as OpenAI allows; generation ends before the first one and it is not returned. */
  stop?: string[];
};

export type GenerateInput = ({ kind: 'chat'; messages: ChatMessage[] } | { kind: 'completion'; prompt: string }) &
  Sampling & {
    /** An adapter of this model by its catalog name; absent for the base model. */
    adapter?: string;
    /** Aborted when the client goes away: the sequence is freed at once. */
    signal: AbortSignal;
    /** Called with each piece of text as it is generated (for streaming); the pieces joined are `text`. */
    onText?: (text: string) => void;
  };

export type Generated = {
  text: string;
  finishReason: 'stop' | 'length';
  /** Counted in the model's own tokens. */
  promptTokens: number;
  /** Of promptTokens, those whose KV state an earlier request left and this one reused (OpenAI's cached_tokens). */
  cachedTokens?: number;
  completionTokens: number;
};

export type Embedded = { vectors: number[][]; promptTokens: number };

/** Why a served model refused a request, mapped by the HTTP layer to OpenAI's status and error type. */
export class EngineError extends Error {
  override name = 'EngineError';
  constructor(
    /** busy: every sequence is taken and the queue is full (429); unknown_adapter (404); bad_request (400);
     * too_long: the prompt leaves no room in the context (400, OpenAI's `context_length_exceeded`, which clients
     * such as `hangar chat` read to drop old turns); unsupported: e.g. embeddings from a model that does not make
     * them (400). */
    readonly kind: 'busy' | 'unknown_adapter' | 'bad_request' | 'too_long' | 'unsupported',
    message: string,
    /** The request field it is about, when there is one (OpenAI's `param`). */
    readonly param?: string,
  ) {
    super(message);
  }
}

/** One replica as its node serves it: the base model and the adapters loaded on it. */
export interface ServedModel {
  /** The catalog name requests ask for (OpenAI's `model`). */
  readonly name: string;
  /** Adapter names requests may ask for (as `model`, or `model` = the base plus an adapter): see http.ts. */
  adapters(): string[];
  /** Whether /v1/embeddings works for this model. */
  readonly embeddings: boolean;
  generate(input: GenerateInput): Promise<Generated>;
  embed(input: string[], signal: AbortSignal): Promise<Embedded>;
}
