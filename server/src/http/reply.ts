import type { ServerResponse } from 'node:http';
import type { HangarError } from '../lib/errors.js';

// How the HTTP edge answers in Hangar's own words: one JSON writer, and one table from the typed errors services
// return to the status a script branches on. The foreign protocols keep one writer each for their own shapes
// (OpenAI's on /v1: sendOpenAiJson in @hangar/common/openai-error, shared with the node's endpoint; the Hub's on
// /hf: hubJson in hf/hf.http.ts, which writes through sendJson); they take their status from here where they
// have one.

/**
 * The status for each typed error. A code missing here answers 400: every HangarError is the caller's to act on,
 * and a status the caller cannot act on (500) would hide that. Before this table serve.ts answered NOT_FOUND
 * with 400, so a script could not tell "no such thing" from "bad input".
 */
const STATUS: Record<string, number> = {
  VALIDATION: 400,
  UNAUTHENTICATED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  UNPROCESSABLE: 422,
  TOO_MANY_ATTEMPTS: 429,
  UNLOADABLE: 422,
  UPSTREAM: 502,
  REGISTRY_OFF: 503,
};

export function statusOf(error: Pick<HangarError, 'code'>): number {
  return STATUS[error.code] ?? 400;
}

/**
 * A JSON answer with its length (so a client knows it has all of it); `head` leaves the body off, as HEAD must,
 * with the same headers.
 */
export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  o: { headers?: Record<string, string | number>; head?: boolean } = {},
): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...o.headers,
  });
  res.end(o.head ? undefined : text);
}

/** A typed error as Hangar's JSON refusal: `{ error, code }`, with the status the table gives it. */
export function sendError(res: ServerResponse, error: HangarError, o: { head?: boolean } = {}): void {
  sendJson(res, statusOf(error), { error: error.message, code: error.code }, o);
}
