import type { IncomingMessage, ServerResponse } from 'node:http';
import { ApiError, sendError } from '@hangar/common/openai-error';
import type { Target } from './routes.js';

// The gateway's answers that are not a replica's: why nothing serves a model yet, a 503 with Retry-After, JSON,
// and a refusal sent before the body is read.

/** Why nothing serves a model now, in the fleet's words; `final` when waiting will not change it. */
export function whyNotReady(target: Target): { text: string; final: boolean } {
  const { model, adapter } = target;
  const unplaced = model.replicas.find((r) => r.state === 'PENDING' && !r.nodeName && r.message);
  if (unplaced?.message?.startsWith('fits on no node')) return { text: unplaced.message, final: true };
  // A replica failed and placement found no node for another: nothing is starting, and waiting the whole
  // HANGAR_GATEWAY_WAKE_SECONDS would only delay the same answer (the failed node is skipped for minutes).
  const starting = model.replicas.some((r) => r.state === 'LOADING' || (r.state === 'PENDING' && r.nodeName));
  if (model.failed && !starting && (unplaced || !model.replicas.length)) {
    const then = unplaced?.message ? `, and ${unplaced.message}` : '';
    return { text: `its last replica failed: ${model.failed}${then}`, final: true };
  }
  if (unplaced?.message) return { text: unplaced.message, final: false };
  const loading = model.replicas.find((r) => r.state === 'LOADING' || r.state === 'PENDING');
  if (loading) {
    return {
      text: `a replica is loading on ${loading.nodeName ?? 'a node'}${loading.message ? `: ${loading.message}` : ''}`,
      final: false,
    };
  }
  if (adapter && model.replicas.some((r) => r.state === 'READY')) {
    return { text: `no replica has loaded the adapter ${adapter.name} yet`, final: false };
  }
  if (model.failed) return { text: `its last replica failed: ${model.failed}`, final: false };
  return { text: 'no replica is placed yet', final: false };
}

export function unavailable(message: string, retryAfterSeconds: number): ApiError {
  return new ApiError(503, message, 'server_error', null, 'model_unavailable', {
    'retry-after': String(retryAfterSeconds),
  });
}

/** Answers before reading the body, then closes: an unread body must not be read as the next request. */
export function refuseEarly(req: IncomingMessage, res: ServerResponse, err: ApiError) {
  const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined;
  if (hasBody && !req.complete) res.setHeader('connection', 'close');
  sendError(res, err);
  if (hasBody && !req.complete) res.once('finish', () => req.socket.destroy());
}

/** Whether a replica's answer is of a kind the gateway passes on: JSON, or a stream of server-sent events. */
export function relayable(contentType: string | undefined): boolean {
  // None at all is taken as JSON, as the engines that omit it mean; it goes out labelled so, and nosniff.
  if (!contentType) return true;
  const type = contentType.split(';')[0]?.trim().toLowerCase() ?? '';
  return type === 'application/json' || type.endsWith('+json') || type === 'text/event-stream';
}

/**
 * What a caller gets of a replica's error answer (its body, read whole): OpenAI's error as the replica worded it,
 * with its Retry-After, unless it quotes the engine key (whole, or masked as OpenAI quotes keys: its first or last
 * characters), which only the control plane may hold; or unless it is not OpenAI's JSON (an HTML page from a
 * proxy in front of an engine), which must not reach a browser on the console's origin. Either of those is
 * answered in the gateway's own words.
 */
export function relayedError(
  status: number,
  body: Buffer,
  o: { engineKey: string; model: string; retryAfter: string | undefined },
): ApiError {
  const text = body.toString('utf8');
  const headers: Record<string, string> = o.retryAfter ? { 'retry-after': o.retryAfter } : {};
  const type = status < 500 ? 'invalid_request_error' : 'server_error';
  const quotesKey = [o.engineKey, o.engineKey.slice(0, 8), o.engineKey.slice(-8), 'hgk_'].some(
    (k) => k.length >= 4 && text.includes(k),
  );
  if (quotesKey) {
    return new ApiError(
      status,
      `The replica serving ${o.model} refused the request (${status}); its words are not passed on because they quote the key the gateway sent it.`,
      type,
      null,
      null,
      headers,
    );
  }
  try {
    const { error } = JSON.parse(text) as {
      error?: { message?: unknown; type?: unknown; param?: unknown; code?: unknown };
    };
    if (error && typeof error.message === 'string') {
      const str = (v: unknown) => (typeof v === 'string' ? v : null);
      return new ApiError(status, error.message, str(error.type) ?? type, str(error.param), str(error.code), headers);
    }
  } catch {
    // Not JSON: answered in the gateway's words below.
  }
  return new ApiError(
    status,
    `The replica serving ${o.model} answered ${status} without an OpenAI error body.`,
    type,
    null,
    null,
    headers,
  );
}
