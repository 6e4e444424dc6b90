import type { ServerResponse } from 'node:http';
import { ApiError, sendError } from '@hangar/common/openai-error';
import type { Caller } from '../gateway/callers.js';
import type { Target } from '../gateway/routes.js';
import type { LimitEnforcer, Settled } from './limits-enforcer.js';
import type { PriorityGate } from './limits-priority.js';

// Where the gateway meets limits, in OpenAI's words: one call before a replica is picked (admit) and one when the
// request is accounted (settle). A refusal is a 429 as OpenAI sends it, with Retry-After (and Retry-After-Ms,
// which the official clients read first), so their own retry waits for the reset; OpenAI's x-ratelimit-* headers
// go on every /v1 answer a limit applies to, refusals included.

/** charge() after each try with what it delivered; settle() once, when the request has ended. */
export type LimitHold = { charge(usage: Settled): void; settle(): void };

const NOTHING: LimitHold = { charge: () => {}, settle: () => {} };

export type LimitGateDeps = {
  enforcer: LimitEnforcer;
  priority: PriorityGate;
  /** How long a batch request may wait behind interactive ones (HANGAR_GATEWAY_WAKE_SECONDS). */
  batchWaitMs: number;
};

export class LimitGate {
  constructor(private readonly deps: LimitGateDeps) {}

  /**
   * Reserves the request's worst case under every limit that applies (and, for a batch token, waits its turn);
   * undefined when it was refused, already answered.
   */
  async admit(
    res: ServerResponse,
    caller: Caller,
    target: Target,
    body: Record<string, unknown>,
    route: string,
  ): Promise<LimitHold | undefined> {
    const got = await this.tryAdmit(res, caller, target, body, route);
    if (got instanceof ApiError) return void sendError(res, got);
    return got;
  }

  /**
   * As admit, but a refusal is handed back unanswered, so that the gateway may try the model's fallbacks first
   * (a limit on one model is no reason to refuse a request another model could answer); undefined when the
   * client left while its batch request waited.
   */
  async tryAdmit(
    res: ServerResponse,
    caller: Caller,
    target: Target,
    body: Record<string, unknown>,
    route: string,
  ): Promise<LimitHold | ApiError | undefined> {
    const { enforcer, priority } = this.deps;
    const batch = caller.viewer.kind === 'token' && caller.viewer.batch === true;
    const model = target.model.name;
    let ended: (() => void) | undefined;
    if (batch) {
      const left = new AbortController();
      const gone = () => left.abort();
      res.once('close', gone);
      const ready = () => (target.model.replicas ?? []).filter((r) => r.state === 'READY').length;
      const turn = await priority.batchTurn(model, ready, this.deps.batchWaitMs, left.signal);
      res.off('close', gone);
      if (left.signal.aborted) return undefined;
      if (!turn.ok) {
        return new ApiError(
          429,
          `Batch requests wait behind interactive ones: ${turn.interactive} interactive requests held every replica of ${model} for the ${Math.round(turn.waitedMs / 1000)} s a batch request may wait (HANGAR_GATEWAY_WAKE_SECONDS); try again later.`,
          'rate_limit_exceeded',
          null,
          'rate_limit_exceeded',
          { 'retry-after': '5', 'retry-after-ms': '5000' },
        );
      }
    } else {
      ended = priority.interactiveStarted(model);
    }
    const admitted = await enforcer.admit({
      tokenId: caller.tokenId,
      userId: caller.userId,
      reach: caller.reach,
      batch,
      model,
      adapter: target.adapter?.name,
      body,
      contextSize: target.model.contextSize ?? null,
      embeddings: route === '/embeddings',
    });
    if (!admitted.ok) {
      ended?.();
      const r = admitted.refusal;
      const seconds = Math.max(1, Math.ceil(r.retryAfterMs / 1000));
      const headers: Record<string, string> = { ...r.headers, 'retry-after': String(seconds) };
      // The official clients wait Retry-After-Ms first; a quota that resets next month is not worth retrying.
      if (r.retryUseless) headers['x-should-retry'] = 'false';
      else headers['retry-after-ms'] = String(Math.ceil(r.retryAfterMs));
      return new ApiError(r.status, r.message, r.type, null, r.code, headers);
    }
    const { ticket } = admitted;
    for (const [name, value] of Object.entries(ticket.headers)) res.setHeader(name, value);
    return {
      charge: (usage) => ticket.charge(usage),
      settle: () => {
        ticket.release();
        ended?.();
      },
    };
  }

  /** The x-ratelimit-* headers of a caller's tightest limits, on an answer that reserves nothing (/v1/models). */
  peek(res: ServerResponse, caller: Caller): void {
    for (const [name, value] of Object.entries(
      this.deps.enforcer.peek({ tokenId: caller.tokenId, userId: caller.userId, reach: caller.reach, model: '' }),
    ))
      res.setHeader(name, value);
  }

  static readonly none: LimitHold = NOTHING;
}
