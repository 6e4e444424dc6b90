import type { ServerResponse } from 'node:http';
import { ApiError, invalid, sendError, sendOpenAiJson } from '@hangar/common/openai-error';
import { EngineError, type Generated } from './engine.js';

// The OpenAI-compatible endpoint's (http.ts) routing table and reply helpers: JSON answers, engine errors in
// OpenAI's statuses, usage, base64 embeddings and server-sent events as OpenAI sends them.

export type Route =
  | { kind: 'none' }
  | { kind: 'method'; allow: string }
  | { kind: 'health' }
  | { kind: 'models' }
  | { kind: 'model'; id: string }
  | { kind: 'chat' | 'completion' | 'embeddings' };

export function routeOf(method: string, path: string): Route {
  const table: Record<string, { method: string; route: Route }> = {
    '/health': { method: 'GET', route: { kind: 'health' } },
    '/v1/models': { method: 'GET', route: { kind: 'models' } },
    '/v1/chat/completions': { method: 'POST', route: { kind: 'chat' } },
    '/v1/completions': { method: 'POST', route: { kind: 'completion' } },
    '/v1/embeddings': { method: 'POST', route: { kind: 'embeddings' } },
  };
  let hit = table[path];
  if (!hit && path.startsWith('/v1/models/') && path.length > '/v1/models/'.length) {
    let id: string;
    try {
      id = decodeURIComponent(path.slice('/v1/models/'.length));
    } catch {
      return { kind: 'none' };
    }
    hit = { method: 'GET', route: { kind: 'model', id } };
  }
  if (!hit) return { kind: 'none' };
  if (hit.method !== method) return { kind: 'method', allow: hit.method };
  return hit.route;
}

export const now = () => Math.floor(Date.now() / 1000);

export function usageOf(out: Generated) {
  return {
    prompt_tokens: out.promptTokens,
    completion_tokens: out.completionTokens,
    total_tokens: out.promptTokens + out.completionTokens,
    // As OpenAI reports prompt caching: the prompt tokens that were not computed again. An engine that keeps no
    // state (the stand-ins in tests) says nothing rather than a zero it did not measure.
    ...(out.cachedTokens === undefined ? {} : { prompt_tokens_details: { cached_tokens: out.cachedTokens } }),
  };
}

/** OpenAI's base64 embeddings: the vector's float32s, little-endian, as the official clients decode them. */
export function float32Base64(vector: number[]): string {
  const buf = Buffer.alloc(vector.length * 4);
  for (const [i, x] of vector.entries()) buf.writeFloatLE(x, i * 4);
  return buf.toString('base64');
}

/** EngineError → OpenAI's status and type; undefined for anything unexpected (logged, answered as 500). */
export function engineRefusal(err: unknown): ApiError | undefined {
  if (!(err instanceof EngineError)) return undefined;
  switch (err.kind) {
    case 'busy':
      // OpenAI's own 429 shape, so clients that back off on `rate_limit_exceeded` do so here too.
      return new ApiError(429, err.message, 'requests', err.param ?? null, 'rate_limit_exceeded', {
        'retry-after': '1',
      });
    case 'unknown_adapter':
      return new ApiError(404, err.message, 'invalid_request_error', err.param ?? 'model', 'model_not_found');
    case 'bad_request':
      return invalid(err.message, err.param ?? null);
    case 'too_long':
      return invalid(err.message, err.param ?? null, 'context_length_exceeded');
    case 'unsupported':
      return invalid(err.message, err.param ?? null, 'unsupported_value');
  }
}

export function serverError() {
  return new ApiError(
    500,
    'The server had an error while processing your request; the node logged it.',
    'server_error',
  );
}

export function send(res: ServerResponse, statusOrError: number | ApiError, payload?: unknown) {
  if (res.destroyed) return; // the client went away: there is nobody to answer
  if (statusOrError instanceof ApiError) return sendError(res, statusOrError);
  sendOpenAiJson(res, statusOrError, payload);
}

/**
 * Server-sent events as OpenAI sends them: `data: {chunk}` events and `data: [DONE]`. The headers go out with
 * the first piece of text, not before: a request refused before generating (busy, a bad adapter) still gets its
 * own status and error body instead of a 200 stream holding an error.
 */
export function eventStream(res: ServerResponse, includeUsage: boolean) {
  // Events made in the same turn of the event loop go out in one write: a small model makes a token every
  // millisecond, and a write (and a read at the client) per token would cost more than the token.
  let corked = false;
  const write = (data: string) => {
    if (!corked) {
      corked = true;
      res.cork();
      setImmediate(() => {
        corked = false;
        res.uncork();
      });
    }
    res.write(`data: ${data}\n\n`);
  };
  let started = false;
  const start = (first: () => void) => {
    if (started) return;
    started = true;
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      // A proxy in front (nginx) would otherwise hold the tokens back to fill its buffer.
      'x-accel-buffering': 'no',
    });
    first();
  };
  return {
    /** With include_usage every chunk carries `usage: null`, and a last one the usage with no choices. */
    chunk(obj: Record<string, unknown>) {
      write(JSON.stringify(includeUsage ? { ...obj, usage: null } : obj));
    },
    async run(
      first: () => void,
      work: (onText: (text: string) => void) => Promise<Generated>,
      piece: (text: string) => void,
    ): Promise<Generated | undefined> {
      const out = await work((text) => {
        if (!text || res.writableEnded || res.destroyed) return;
        start(first);
        piece(text);
      });
      // A model that ends early on abort resolves with what it had: nobody is left to send it to.
      if (res.destroyed) return undefined;
      start(first);
      return out;
    },
    end(usageChunk: Record<string, unknown>) {
      if (includeUsage) write(JSON.stringify(usageChunk));
      write('[DONE]');
      res.end();
    },
  };
}
