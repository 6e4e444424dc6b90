import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import type { Db } from '../db/client.js';
import type { CatalogModel } from '../generated/prisma/client.js';
import { ConflictError, fail, ok, type Result } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { declaredMessage } from './catalog-input.js';
import { modeOf } from './mode.js';

// setModelScaling: the bounds and the target of a model's autoscaling (fleet/scaling.ts). minReplicas 0 is the
// on-demand mode (a request wakes it, it sleeps when idle), and the autoscaler adds replicas up to max while the
// load per replica stays above the target for HANGAR_SCALE_WINDOW_SECONDS. setModelMode sets a fixed count again.

const scalingInput = z
  .object({
    minReplicas: z.number().int().min(0, '0 (on demand) or more').max(64, 'at most 64 replicas'),
    maxReplicas: z
      .number()
      .int()
      .min(1, 'at least 1: to stop the model, set its mode to STOPPED (setModelMode)')
      .max(64, 'at most 64 replicas'),
    targetInFlight: z
      .number()
      .gt(0, 'more than 0: the requests in flight per replica to keep it near, such as 2')
      .max(1000, 'at most 1000 requests per replica'),
  })
  .superRefine((v, ctx) => {
    if (v.maxReplicas < v.minReplicas)
      ctx.addIssue({
        code: 'custom',
        path: ['maxReplicas'],
        message: `at least minReplicas (${v.minReplicas}): the autoscaler moves between the two`,
      });
  });

export type ModelScalingDeps = {
  db: Db;
  audit: AuditService;
  /** A placement pass: the new bounds may add or drain replicas at once. */
  place: () => Promise<void>;
  /** Where a declared model is declared, for the refusal. */
  declaredIn: (name: string) => { file: string; key: string } | null;
};

export async function setScaling(
  deps: ModelScalingDeps,
  actor: Actor,
  m: CatalogModel,
  input: { minReplicas: number; maxReplicas: number; targetInFlight: number },
): Promise<Result<CatalogModel>> {
  const parsed = parseInput(scalingInput, input, '');
  if (!parsed.ok) return parsed;
  if (m.declared) return fail(new ConflictError(declaredMessage(m.name, deps.declaredIn(m.name))));
  const { minReplicas, maxReplicas, targetInFlight } = parsed.value;
  const updated = await deps.db.$transaction(async (tx) => {
    const u = await tx.catalogModel.update({
      where: { id: m.id },
      // Awake means something only on demand (setModelMode keeps the same rule).
      data: { minReplicas, maxReplicas, targetInFlight, ...(minReplicas > 0 ? { awakeUntil: null } : {}) },
    });
    await deps.audit.done(tx, actor, {
      action: 'setModelScaling',
      target: m.name,
      message: `${modeOf(m)} ${m.minReplicas}–${m.maxReplicas}${m.targetInFlight != null ? `, target ${m.targetInFlight}` : ''} → ${minReplicas}–${maxReplicas} replicas, target ${targetInFlight} in flight per replica`,
      owner: m.owner,
    });
    return u;
  });
  await deps.place();
  return ok(updated);
}
