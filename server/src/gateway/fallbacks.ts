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
