import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import type { Db } from '../db/client.js';
import type { CatalogModel } from '../generated/prisma/client.js';
import type { RoutingPolicy } from '../generated/prisma/enums.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { catalogName } from './catalog-input.js';

// How the gateway routes a model's requests (setModelRouting) and who answers when it cannot (setModelFallbacks).
// Neither is declared state: hangar.yaml says what is served, these say how, so they may be set on a declared model
// too (its next start leaves them as they are).

/** More would only lengthen a failing request's wait: each fallback may itself wait for a wake. */
export const MAX_FALLBACKS = 4;

export const routingPolicies = ['LEAST_LOADED', 'PREFIX', 'SESSION'] as const satisfies readonly RoutingPolicy[];

export type ModelRoutingDeps = {
  db: Db;
  audit: AuditService;
  /** A model by name as the actor may see it (none for one it may not: the same words as a name nobody has). */
  visibleModel: (actor: Actor, name: string) => Promise<CatalogModel | null>;
};

export async function setRouting(
  deps: ModelRoutingDeps,
  actor: Actor,
  m: CatalogModel,
  policy: string,
): Promise<Result<CatalogModel>> {
  const parsed = parseInput(z.object({ policy: z.enum(routingPolicies) }), { policy }, '');
  if (!parsed.ok) return parsed;
  return ok(
    await deps.db.$transaction(async (tx) => {
      const updated = await tx.catalogModel.update({ where: { id: m.id }, data: { routing: parsed.value.policy } });
      await deps.audit.done(tx, actor, {
        action: 'setModelRouting',
        target: m.name,
        message: `routing ${m.routing} → ${parsed.value.policy}`,
        owner: m.owner,
      });
      return updated;
    }),
  );
}

export async function setFallbacks(
  deps: ModelRoutingDeps,
  actor: Actor,
  m: CatalogModel,
  fallbacks: string[],
): Promise<Result<CatalogModel>> {
  const parsed = parseInput(
    z.object({
      fallbacks: z
        .array(catalogName)
        .max(MAX_FALLBACKS, `at most ${MAX_FALLBACKS} models: each one tried may wait for its own wake`),
    }),
    { fallbacks },
    '',
  );
  if (!parsed.ok) return parsed;
  const names = parsed.value.fallbacks;
  for (const [i, name] of names.entries()) {
    if (name === m.name)
      return fail(new ValidationError(`fallbacks.${i}`, `${name} cannot fall back to itself: name other models`));
    if (names.indexOf(name) !== i)
      return fail(new ValidationError(`fallbacks.${i}`, `${name} is listed twice: name each model once`));
    // Named as any other lookup of the actor's: a model they may not see reads as one the catalog lacks.
    if (!(await deps.visibleModel(actor, name)))
      return fail(
        new ValidationError(
          `fallbacks.${i}`,
          `the catalog has no model ${name}: a fallback is a model in the catalog (see models)`,
        ),
      );
  }
  return ok(
    await deps.db.$transaction(async (tx) => {
      const updated = await tx.catalogModel.update({ where: { id: m.id }, data: { fallbacks: names } });
      await deps.audit.done(tx, actor, {
        action: 'setModelFallbacks',
        target: m.name,
        message: `fallbacks ${m.fallbacks.length ? m.fallbacks.join(', ') : 'none'} → ${names.length ? names.join(', ') : 'none'}`,
        owner: m.owner,
      });
      return updated;
    }),
  );
}
