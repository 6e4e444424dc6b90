import http, { type IncomingMessage } from 'node:http';
import https from 'node:https';
import { Transform, type TransformCallback } from 'node:stream';
import type { Departure } from './departure.js';

// The gateway's side of a replica's endpoint: one request out, with the replica's engine key, over kept-alive
// connections (a new TCP connection per request would be most of the gateway's added latency), and taps that
// read the engine's usage from what passes through without holding it up.

const agents = {
  'http:': new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY, maxFreeSockets: 256 }),
  'https:': new https.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY, maxFreeSockets: 256 }),
};

type UpstreamTarget = {
  transport: typeof http | typeof https;
  agent: http.Agent;
  protocol: string;
  hostname: string;
  port: string;
  path: string;
};
/** Replicas' URLs, parsed once each (a URL parse per request showed in the gateway's profile); few, and bounded. */
const targets = new Map<string, UpstreamTarget>();

function targetOf(endpoint: string, route: string): UpstreamTarget {
  const key = `${endpoint}\n${route}`;
  let target = targets.get(key);
  if (!target) {
    const url = new URL(`${endpoint.replace(/\/+$/, '')}${route}`);
    const https_ = url.protocol === 'https:';
    target = {
      transport: https_ ? https : http,
      agent: agents[https_ ? 'https:' : 'http:'],
      protocol: url.protocol,
      hostname: url.hostname.replace(/^\[|\]$/g, ''),
      port: url.port,
      path: `${url.pathname}${url.search}`,
    };
    if (targets.size >= 4096) targets.clear();
    targets.set(key, target);
  }
  return target;
}

/** Why a replica was given up on before it sent anything: the request may go to another one. */
export class UpstreamUnreached extends Error {
  override name = 'UpstreamUnreached';
}

/**
 * Sends `body` to `endpoint` + `route` (endpoint is the replica's …/v1) and resolves with the response once its
 * headers arrive. Rejects with UpstreamUnreached when the connection fails or no headers come within
 * `firstByteMs`; `gone` (the client went away) destroys the request at any point, body included.
 */
export function send(o: {
  endpoint: string;
  route: string;
  engineKey: string;
  body: Buffer;
  stream: boolean;
  firstByteMs: number;
  gone: Departure;
}): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    if (o.gone.aborted) return reject(o.gone.reason);
    const target = targetOf(o.endpoint, o.route);
    const req = target.transport.request({
      protocol: target.protocol,
      hostname: target.hostname,
      port: target.port,
      path: target.path,
      method: 'POST',
      agent: target.agent,
      headers: {
        'content-type': 'application/json',
        'content-length': o.body.length,
        accept: o.stream ? 'text/event-stream' : 'application/json',
        authorization: `Bearer ${o.engineKey}`,
      },
    });
    // Not http.request's own `signal` option, which wraps each request in listeners added and removed again: the
    // departure is the forward's own, and dies with it, so one callback that destroys the request does (the answer
    // with it, mid-stream included).
    o.gone.onAbort((reason) => req.destroy(reason));
    const timer = setTimeout(() => {
      req.destroy(new UpstreamUnreached(`no answer within ${o.firstByteMs} ms (HANGAR_GATEWAY_FIRST_BYTE_MS)`));
    }, o.firstByteMs);
    req.once('response', (res) => {
      clearTimeout(timer);
      resolve(res);
    });
    req.once('error', (err) => {
      clearTimeout(timer);
      if (o.gone.aborted || err instanceof UpstreamUnreached) return reject(err);
      reject(new UpstreamUnreached((err as NodeJS.ErrnoException).code ?? err.message));
    });
    req.end(o.body);
  });
}

/**
 * An answer of `length` bytes (its Content-Length), read whole: by its events, without an async iterator's promise
 * per chunk (most answers are one chunk). Rejects as the stream errs, or when it ends short of `length`.
 */
export function readWhole(answer: IncomingMessage, length: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    let first: Buffer | undefined;
    let chunks: Buffer[] | undefined;
    answer.on('data', (chunk: Buffer) => {
      if (!first) first = chunk;
      else if (chunks) chunks.push(chunk);
      else chunks = [first, chunk];
    });
    answer.once('end', () => {
      const whole = chunks ? Buffer.concat(chunks) : (first ?? Buffer.alloc(0));
      if (whole.length < length) reject(new Error(`the answer ended after ${whole.length} of its ${length} bytes`));
      else resolve(whole);
    });
    answer.once('error', reject);
    // Destroyed without an error (the request was): 'close' without 'end'.
    answer.once('close', () => {
      if (!answer.readableEnded) reject(new Error('the answer was cut off'));
    });
  });
}

/** cachedTokens: of the prompt tokens, those the engine reused from its prompt cache (absent when it said none). */
export type Usage = { promptTokens: number; completionTokens: number; cachedTokens?: number };

const readUsage = (u: unknown): Usage | null => {
  const usage = u as
    | { prompt_tokens?: unknown; completion_tokens?: unknown; prompt_tokens_details?: { cached_tokens?: unknown } }
    | null
    | undefined;
  if (!usage || typeof usage.prompt_tokens !== 'number') return null;
  const cached = usage.prompt_tokens_details?.cached_tokens;
  return {
    promptTokens: usage.prompt_tokens,
    completionTokens: typeof usage.completion_tokens === 'number' ? usage.completion_tokens : 0,
    // OpenAI's place for it (the agent's llama.cpp replicas, vLLM and llama-server write it there); never more
    // than the prompt, whatever an engine claims.
    ...(typeof cached === 'number' && cached > 0 ? { cachedTokens: Math.min(cached, usage.prompt_tokens) } : {}),
  };
};

/**
 * The prompt's tokens as estimated from the request, for an answer that ended before the engine said how many it
 * read: a token per 4 characters of its text (OpenAI's rule of thumb for English), and a token per token id of a
 * prompt given as ids. Text inside content parts counts; images and audio do not.
 */
export function estimatePromptTokens(body: Record<string, unknown>): number {
  let chars = 0;
  let ids = 0;
  const walk = (v: unknown): void => {
    if (typeof v === 'string') chars += v.length;
    else if (typeof v === 'number') ids++;
    else if (Array.isArray(v)) for (const item of v) walk(item);
    else if (v && typeof v === 'object') walk((v as { text?: unknown }).text);
  };
  if (Array.isArray(body.messages)) for (const m of body.messages) walk((m as { content?: unknown } | null)?.content);
  walk(body.prompt);
  walk(body.input);
  return ids + Math.ceil(chars / 4);
}

const EMPTY = Buffer.alloc(0);
const EVENT_END = Buffer.from('\n\n');
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const USAGE_MARK = Buffer.from('"usage":{');

/**
 * Passes a stream of server-sent events through, noting when the first event came and the usage the engine
 * sent in its last one. The gateway asks every engine for that usage chunk (stream_options.include_usage);
 * a client that did not ask for it does not get it (`strip`), as OpenAI would not send it.
 */
export class SseTap extends Transform {
  firstEventAt: number | null = null;
  usage: Usage | null = null;
  /** Whether the engine's usage chunk (its usage and no choices, after the last token) came. */
  usageChunkCame = false;
  /** Chunks carrying a token (text, reasoning or a tool call) passed on to the client. */
  delivered = 0;
  /** The bytes after the last whole event, waiting for the rest of it. */
  private pending: Buffer = EMPTY;

  constructor(private readonly strip: boolean) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback) {
    const out = this.passOn(chunk);
    done(null, out.length ? out : undefined);
  }

  override _flush(done: TransformCallback) {
    done(null, this.rest() ?? undefined);
  }

  /** What of `chunk` goes on to the client now (the whole events in it, less a usage chunk it did not ask for). */
  passOn(chunk: Buffer): Buffer | string {
    this.firstEventAt ??= performance.now();
    const bytes = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk;
    // Only whole events are looked into: a usage chunk split across reads is still found. Cut at the bytes of
    // a blank line, which is never inside a UTF-8 character, so nothing is decoded that does not need to be.
    const n = bytes.length;
    // Most reads end with an event's end: looked at directly, not searched for.
    const end = n >= 2 && bytes[n - 1] === 10 && bytes[n - 2] === 10 ? n - 2 : bytes.lastIndexOf(EVENT_END);
    if (end < 0) {
      this.pending = bytes;
      return EMPTY;
    }
    this.pending = end + 2 < bytes.length ? bytes.subarray(end + 2) : EMPTY;
    const events = end + 2 < bytes.length ? bytes.subarray(0, end + 2) : bytes;
    this.delivered += tokenChunks(events);
    // The common case, a token's chunk: the same bytes go on, undecoded and uncopied (this runs per token).
    if (events.indexOf(USAGE_MARK) < 0) return events;
    let out = '';
    for (const event of events.toString('utf8').split('\n\n')) {
      if (!event) continue;
      if (event.includes('"usage":{')) {
        const data = event.startsWith('data: ') ? event.slice(6) : event.replace(/^data:/, '');
        try {
          const parsed = JSON.parse(data) as { usage?: unknown; choices?: unknown[] };
          this.usage = readUsage(parsed.usage) ?? this.usage;
          const usageChunk = Array.isArray(parsed.choices) && parsed.choices.length === 0;
          if (usageChunk && this.usage) this.usageChunkCame = true;
          if (this.strip && usageChunk) continue;
        } catch {
          // Not JSON: passed on as it came.
        }
      }
      out += `${event}\n\n`;
    }
    return out;
  }

  /** What is left when the stream ends: bytes after the last whole event, passed on as they came. */
  rest(): Buffer | null {
    return this.pending.length ? this.pending : null;
  }

  /**
   * What the request is accounted: the engine's usage when its usage chunk came. Otherwise (the client left, the
   * replica died, an engine that sends none) what the client was sent: a token per chunk that carried one, and
   * the prompt as the engine reported it in an earlier chunk (vLLM's continuous usage) or estimated from the
   * request (`prompt`), since the engine read the whole prompt before its first token.
   */
  accounted(prompt: () => number): Usage {
    if (this.usage && this.usageChunkCame) return this.usage;
    return {
      promptTokens: this.usage?.promptTokens ?? prompt(),
      completionTokens: Math.max(this.delivered, this.usage?.completionTokens ?? 0),
      ...(this.usage?.cachedTokens ? { cachedTokens: this.usage.cachedTokens } : {}),
    };
  }
}

// Where a chunk carries a token: its text (chat, reasoning, completions) with at least one character, or a tool
// call. Looked for in the bytes, not parsed (this runs per token): a quote inside a JSON string is escaped, so
// these can only be keys. Compact JSON (every engine's) and json.dumps' default ", " / ": " spacing.
const TOKEN_MARKS = ['"content":"', '"text":"', '"reasoning_content":"', '"content": "', '"text": "']
  .map((m) => ({ mark: Buffer.from(m), string: true }))
  .concat(['"tool_calls":[{', '"tool_calls": [{'].map((m) => ({ mark: Buffer.from(m), string: false })));

/** How many of the events in `events` (whole ones, each ending with a blank line) carry a token. */
function tokenChunks(events: Buffer): number {
  let count = 0;
  for (let start = 0; start < events.length; ) {
    const at = events.indexOf(EVENT_END, start);
    const end = at < 0 ? events.length : at;
    const event = events.subarray(start, end);
    for (const { mark, string } of TOKEN_MARKS) {
      const found = event.indexOf(mark);
      // A string mark counts when the text is not empty (the first chunk's `"content":""` is no token).
      if (found >= 0 && (!string || event[found + mark.length] !== QUOTE)) {
        count++;
        break;
      }
    }
    start = end + 2;
  }
  return count;
}

const USAGE_AT = Buffer.from('"usage"');

/**
 * The usage of a whole JSON answer, read from its tail: engines write `usage` as the top-level object's last key,
 * so the object after the last `"usage"` is parsed alone, not the answer a second time (its text can be long). Taken
 * only when that object closes the answer's top level (then a `}` and the end follow it); otherwise, and for any
 * doubt, the whole answer is parsed (usageOfJson).
 */
export function usageOfAnswer(bytes: Buffer): Usage | null {
  const at = bytes.lastIndexOf(USAGE_AT);
  // A `"usage"` inside a string would be escaped (\"usage\"): this one is a key.
  if (at > 0 && bytes[at - 1] !== BACKSLASH) {
    let i = at + USAGE_AT.length;
    while (i < bytes.length && bytes[i]! <= 0x20) i++;
    if (bytes[i] === 0x3a) {
      i++;
      while (i < bytes.length && bytes[i]! <= 0x20) i++;
      if (bytes[i] === 0x7b) {
        const from = i;
        let depth = 0;
        for (; i < bytes.length; i++) {
          const b = bytes[i];
          // A usage object holds numbers and objects: a string in it (a quote) is a doubt, settled by the whole parse.
          if (b === QUOTE) {
            // Keys are strings: skip to the closing quote (a key has no escapes in an engine's usage).
            const close = bytes.indexOf(QUOTE, i + 1);
            if (close < 0 || bytes.subarray(i + 1, close).includes(BACKSLASH)) break;
            i = close;
          } else if (b === 0x7b) depth++;
          else if (b === 0x7d && --depth === 0) break;
        }
        if (depth === 0 && i < bytes.length) {
          const to = i + 1;
          let j = to;
          while (j < bytes.length && bytes[j]! <= 0x20) j++;
          if (bytes[j] === 0x7d) {
            j++;
            while (j < bytes.length && bytes[j]! <= 0x20) j++;
            if (j === bytes.length) return usageOfJson(bytes.subarray(from, to), true);
          }
        }
      }
    }
  }
  return usageOfJson(bytes);
}

/** The usage of a whole JSON answer (or, with `isUsage`, the usage object itself); null when none or not JSON. */
export function usageOfJson(bytes: Buffer, isUsage = false): Usage | null {
  try {
    const parsed = JSON.parse(bytes.toString('utf8')) as { usage?: unknown };
    return readUsage(isUsage ? parsed : parsed.usage);
  } catch {
    return null;
  }
}

/**
 * Passes a JSON answer through untouched and reads its top-level `usage` as the bytes go by, whatever the answer's
 * size (a batch of embeddings or a long chat can be many MiB): nothing is held but the usage object itself.
 */
export class JsonTap extends Transform {
  firstByteAt: number | null = null;
  private readonly scanner = new UsageScanner();

  get usage(): Usage | null {
    return this.scanner.usage;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback) {
    done(null, this.passOn(chunk));
  }

  passOn(chunk: Buffer): Buffer {
    this.firstByteAt ??= performance.now();
    this.scanner.push(chunk);
    return chunk;
  }

  rest(): null {
    return null;
  }

  /** The engine's usage; without one (cut short, or an engine that reports none) the prompt, estimated. */
  accounted(prompt: () => number): Usage {
    return this.usage ?? { promptTokens: prompt(), completionTokens: 0 };
  }
}

const USAGE_KEY = Buffer.from('usage');
/** A usage object larger than this is not one an engine wrote: it is not read. */
const USAGE_MAX_BYTES = 64 * 1024;

/**
 * Finds the value of the top-level object's "usage" key in a JSON text fed in pieces, without parsing the rest:
 * it follows only strings (so that a brace or a "usage" inside a text is not taken for one) and the nesting depth
 * (so that a "usage" key deeper down is not either), and keeps the bytes of the usage object alone.
 */
export class UsageScanner {
  usage: Usage | null = null;
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** Reading a key of the top-level object: how many of its bytes so far, and whether they still spell "usage". */
  private key: { length: number; usage: boolean } | null = null;
  private expectKey = false;
  private lastKeyWasUsage = false;
  private valueIsUsage = false;
  private captured: Buffer[] | null = null;
  private capturedBytes = 0;
  private done = false;

  push(chunk: Buffer) {
    if (this.done) return;
    // Where this chunk's part of the usage object starts, while one is being kept.
    let from = 0;
    for (let i = 0; i < chunk.length; i++) {
      const b = chunk[i] as number;
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (b === BACKSLASH) this.escaped = true;
        else if (b === QUOTE) {
          this.inString = false;
          if (this.key) this.lastKeyWasUsage = this.key.usage && this.key.length === USAGE_KEY.length;
          this.key = null;
          continue;
        }
        if (this.key) {
          this.key.usage &&= b === USAGE_KEY[this.key.length];
          this.key.length++;
        }
        continue;
      }
      switch (b) {
        case QUOTE:
          this.inString = true;
          if (this.depth === 1 && this.expectKey) this.key = { length: 0, usage: true };
          this.expectKey = false;
          this.valueIsUsage = false;
          break;
        case 0x3a: // ':' after a key: is the value the usage?
          if (this.depth === 1) this.valueIsUsage = this.lastKeyWasUsage;
          this.lastKeyWasUsage = false;
          break;
        case 0x2c: // ','
          if (this.depth === 1) this.expectKey = true;
          break;
        case 0x7b: // '{'
          if (this.depth === 1 && this.valueIsUsage) {
            this.captured = [];
            this.capturedBytes = 0;
            from = i;
          }
          this.valueIsUsage = false;
          this.depth++;
          this.expectKey = this.depth === 1;
          break;
        case 0x7d: // '}'
        case 0x5d: // ']'
          this.depth--;
          if (this.captured && this.depth === 1) {
            this.captured.push(chunk.subarray(from, i + 1));
            this.usage = usageOfJson(Buffer.concat(this.captured), true);
            this.captured = null;
            this.done = this.usage !== null;
            if (this.done) return;
          }
          break;
        case 0x5b: // '['
          this.depth++;
          this.valueIsUsage = false;
          break;
        default:
          // Any other value after "usage": (null, a number) is not the usage; blanks (≤ 0x20) change nothing.
          if (b > 0x20) this.valueIsUsage = false;
      }
    }
    if (this.captured) {
      this.capturedBytes += chunk.length - from;
      if (this.capturedBytes > USAGE_MAX_BYTES) this.captured = null;
      else this.captured.push(chunk.subarray(from));
    }
  }
}
