import { z } from 'zod';
import { resourceName } from '../lib/names.js';

// What a catalog model's fields accept, from the API and from hangar.yaml alike, and the refusal for a model
// hangar.yaml declares.

export const modeInput = z.enum(['ALWAYS', 'ON_DEMAND', 'STOPPED'], { error: 'ALWAYS, ON_DEMAND or STOPPED' });
export const replicasInput = z.number().int().min(1, 'at least 1 replica').max(64, 'at most 64 replicas');
// Each is a sequence of the replica's one context, with its share of the KV cache: more is more memory.
export const parallelInput = z
  .number({ error: 'requests a replica answers at once, 1 to 64' })
  .int('a whole number of requests')
  .min(1, 'at least 1 request at once')
  .max(64, 'at most 64 requests at once');
export const catalogName = resourceName('a model name');

// hangar.yaml: models an operator keeps in version control. Read at every start; the API shows them and refuses
// to change them, because a change made there would silently revert at the next start.
export const declaredFile = z.object({
  models: z
    .array(
      z.object({
        name: catalogName,
        source: z.string().url('an http:// or https:// URL of the weights'),
        engine: z.enum(['llamacpp', 'vllm'], { error: 'llamacpp or vllm' }),
        context: z.number().int().min(256).max(4_194_304).optional(),
        mode: modeInput.default('ALWAYS'),
        replicas: replicasInput.default(1),
        parallel: parallelInput.default(1),
      }),
    )
    .default([]),
});

export function declaredMessage(name: string, at: { file: string; key: string } | null) {
  const where = at ? `${at.file} (${at.key}, name: ${name})` : 'hangar.yaml';
  return `${name} is declared in ${where}: change it there; it is read at every start`;
}
