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

export function json(res: ServerResponse, status: number, body: unknown) {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** Answers before reading the body, then closes: an unread body must not be read as the next request. */
export function refuseEarly(req: IncomingMessage, res: ServerResponse, err: ApiError) {
  const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined;
  if (hasBody && !req.complete) res.setHeader('connection', 'close');
  sendError(res, err);
  if (hasBody && !req.complete) res.once('finish', () => req.socket.destroy());
}
