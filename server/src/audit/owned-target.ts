import { ownerOfName } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import { versionOwner } from '../mirror/owned.js';
import { ownerOfJob } from '../train/train-store.js';

// A refused or failed mutation has no transaction to write its row in, so its owner is found here, from what its
// arguments name: the row about a team's thing is then shown as the thing is (org-owners.ts `sees`).

type Args = Record<string, unknown>;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * The owner of the model, adapter, training job or adapter's mirror version a mutation's arguments name (`name`,
 * `model`, `id`, `model` + `version`, directly or under `input`); null when none of them is owned. A few lookups by
 * unique keys, made for refusals only.
 */
export async function ownerNamedBy(db: Db, args: Args): Promise<string | null> {
  for (const src of [args, args.input as Args | undefined]) {
    if (!src || typeof src !== 'object') continue;
    const text = (key: string) => (typeof src[key] === 'string' && src[key] ? (src[key] as string) : null);
    const [model, version, name, id] = [text('model'), text('version'), text('name'), text('id')];
    const owners = await Promise.all([
      model && version ? versionOwner(db, model, version).then((o) => o?.owner ?? null) : null,
      ...[name, model && !version ? model : null].map(async (n) => (n ? await ownerOfName(db, n) : null)),
      id && UUID.test(id) ? ownerOfJob(db, id) : null,
    ]);
    const owner = owners.find((o) => o !== null);
    if (owner) return owner;
  }
  return null;
}
