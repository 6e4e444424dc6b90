import http, { type IncomingMessage } from 'node:http';
import https from 'node:https';
import { Transform, type TransformCallback } from 'node:stream';

// The gateway's side of a replica's endpoint: one request out, with the replica's engine key, over kept-alive
// connections (a new TCP connection per request would be most of the gateway's added latency), and taps that
// read the engine's usage from what passes through without holding it up.

const agents = {
  'http:': new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY, maxFreeSockets: 256 }),
  'https:': new https.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY, maxFreeSockets: 256 }),
};

/** Why a replica was given up on before it sent anything: the request may go to another one. */
export class UpstreamUnreached extends Error {
  override name = 'UpstreamUnreached';
}

/**
 * Sends `body` to `endpoint` + `route` (endpoint is the replica's …/v1) and resolves with the response once its
 * headers arrive. Rejects with UpstreamUnreached when the connection fails or no headers come within
 * `firstByteMs`; `signal` (the client went away) destroys the request at any point, body included.
 */
export function send(o: {
  endpoint: string;
  route: string;
  engineKey: string;
  body: Buffer;
  stream: boolean;
  firstByteMs: number;
  signal: AbortSignal;
}): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const url = new URL(`${o.endpoint.replace(/\/+$/, '')}${o.route}`);
    const transport = url.protocol === 'https:' ? https : http;
    const req = transport.request(url, {
      method: 'POST',
      agent: agents[url.protocol as 'http:' | 'https:'],
      headers: {
        'content-type': 'application/json',
        'content-length': o.body.length,
        accept: o.stream ? 'text/event-stream' : 'application/json',
        authorization: `Bearer ${o.engineKey}`,
      },
      signal: o.signal,
    });
    const timer = setTimeout(() => {
      req.destroy(new UpstreamUnreached(`no answer within ${o.firstByteMs} ms (HANGAR_GATEWAY_FIRST_BYTE_MS)`));
    }, o.firstByteMs);
    req.once('response', (res) => {
      clearTimeout(timer);
      resolve(res);
    });
    req.once('error', (err) => {
      clearTimeout(timer);
      if (o.signal.aborted || err instanceof UpstreamUnreached) return reject(err);
      reject(new UpstreamUnreached((err as NodeJS.ErrnoException).code ?? err.message));
    });
    req.end(o.body);
  });
}

export type Usage = { promptTokens: number; completionTokens: number };

const readUsage = (u: unknown): Usage | null => {
  const usage = u as { prompt_tokens?: unknown; completion_tokens?: unknown } | null | undefined;
  if (!usage || typeof usage.prompt_tokens !== 'number') return null;
  return {
    promptTokens: usage.prompt_tokens,
    completionTokens: typeof usage.completion_tokens === 'number' ? usage.completion_tokens : 0,
  };
};

const EMPTY = Buffer.alloc(0);
const EVENT_END = Buffer.from('\n\n');
const USAGE_MARK = Buffer.from('"usage":{');

/**
 * Passes a stream of server-sent events through, noting when the first event came and the usage the engine
 * sent in its last one. The gateway asks every engine for that usage chunk (stream_options.include_usage);
 * a client that did not ask for it does not get it (`strip`), as OpenAI would not send it.
 */
export class SseTap extends Transform {
  firstEventAt: number | null = null;
  usage: Usage | null = null;
  /** The bytes after the last whole event, waiting for the rest of it. */
  private pending: Buffer = EMPTY;

  constructor(private readonly strip: boolean) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback) {
    this.firstEventAt ??= performance.now();
    const bytes = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk;
    // Only whole events are looked into: a usage chunk split across reads is still found. Cut at the bytes of
    // a blank line, which is never inside a UTF-8 character, so nothing is decoded that does not need to be.
    const n = bytes.length;
    // Most reads end with an event's end: looked at directly, not searched for.
    const end = n >= 2 && bytes[n - 1] === 10 && bytes[n - 2] === 10 ? n - 2 : bytes.lastIndexOf(EVENT_END);
    if (end < 0) {
      this.pending = bytes;
      return done();
    }
    this.pending = end + 2 < bytes.length ? bytes.subarray(end + 2) : EMPTY;
    const events = end + 2 < bytes.length ? bytes.subarray(0, end + 2) : bytes;
    // The common case, a token's chunk: the same bytes go on, undecoded and uncopied (this runs per token).
    if (events.indexOf(USAGE_MARK) < 0) return done(null, events);
    let out = '';
    for (const event of events.toString('utf8').split('\n\n')) {
      if (!event) continue;
      if (event.includes('"usage":{')) {
        const data = event.startsWith('data: ') ? event.slice(6) : event.replace(/^data:/, '');
        try {
          const parsed = JSON.parse(data) as { usage?: unknown; choices?: unknown[] };
          this.usage = readUsage(parsed.usage) ?? this.usage;
          if (this.strip && Array.isArray(parsed.choices) && parsed.choices.length === 0) continue;
        } catch {
          // Not JSON: passed on as it came.
        }
      }
      out += `${event}\n\n`;
    }
    done(null, out);
  }

  override _flush(done: TransformCallback) {
    done(null, this.pending.length ? this.pending : undefined);
  }
}

/** The usage of a whole JSON answer; null when it has none or is not JSON. */
export function usageOfJson(bytes: Buffer): Usage | null {
  try {
    return readUsage((JSON.parse(bytes.toString('utf8')) as { usage?: unknown }).usage);
  } catch {
    return null;
  }
}

/** Passes a JSON answer through untouched and reads its `usage` at the end (from at most 1 MiB of it). */
export class JsonTap extends Transform {
  firstByteAt: number | null = null;
  usage: Usage | null = null;
  private chunks: Buffer[] = [];
  private size = 0;

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback) {
    this.firstByteAt ??= performance.now();
    if (this.size < 1 << 20) this.chunks.push(chunk);
    this.size += chunk.length;
    done(null, chunk);
  }

  override _flush(done: TransformCallback) {
    if (this.size <= 1 << 20) this.usage = usageOfJson(Buffer.concat(this.chunks));
    this.chunks = [];
    done();
  }
}
