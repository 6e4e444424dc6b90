import type { ServerResponse } from 'node:http';
import { ApiError, sendError } from '@hangar/common/openai-error';
import type { LimitGate, LimitHold } from '../governance/limits-gate.js';
import type { Caller } from './callers.js';
import type { RouteModel, Target } from './routes.js';

// A model's fallbacks (setModelFallbacks): the models that answer in its place when it has no READY replica and
// none comes in time, or when every replica failed before sending a byte. The caller's own sight decides: a
// fallback they may not call is passed over exactly as if it were not listed, so a fallback never reveals, nor
// lets anyone call, a model they could not name themselves.

/** The fallbacks this caller may call, in order; `see` is the gateway's visibility rule for a name. */
export function fallbackTargets(model: RouteModel, see: (name: string) => Target | undefined): Target[] {
  const out: Target[] = [];
  for (const name of model.fallbacks) {
    if (name === model.name) continue;
    const target = see(name);
    if (target && target.model.name !== model.name) out.push(target);
  }
  return out;
}

/** The request as the fallback is asked it: the same body with its name as `model` (which its answer echoes). */
export function withModel(
  body: Record<string, unknown>,
  model: string,
): { body: Record<string, unknown>; raw: Buffer } {
  const next = { ...body, model };
  return { body: next, raw: Buffer.from(JSON.stringify(next)) };
}

/**
 * Reserves the request under every limit that applies to the model asked; a limit refusal is no reason to refuse
 * what a fallback the caller may call can answer under its own limits, so each is tried in order, and the answer
 * says which (x-hangar-fallback). None admitted: the first refusal is answered (a fallback passed over leaves no
 * trace), and undefined is returned, as when the client left while a batch request waited.
 */
export async function admitOrFallBack(
  gate: LimitGate,
  res: ServerResponse,
  caller: Caller,
  asked: Target,
  body: Record<string, unknown>,
  raw: Buffer,
  route: string,
  see: (name: string) => Target | undefined,
): Promise<{ target: Target; body: Record<string, unknown>; raw: Buffer; limit: LimitHold } | undefined> {
  const first = await gate.tryAdmit(res, caller, asked, body, route);
  if (first === undefined) return undefined;
  if (!(first instanceof ApiError)) return { target: asked, body, raw, limit: first };
  for (const next of fallbackTargets(asked.model, see)) {
    const name = next.adapter?.name ?? next.model.name;
    const nextBody = withModel(body, name);
    const got = await gate.tryAdmit(res, caller, next, nextBody.body, route);
    if (got === undefined) return undefined;
    if (got instanceof ApiError) continue;
    res.setHeader('x-hangar-fallback', name);
    return { target: next, body: nextBody.body, raw: nextBody.raw, limit: got };
  }
  sendError(res, first);
  return undefined;
}
