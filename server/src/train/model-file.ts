import { modelByName } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { mirrorFileRow } from '../mirror/mirror-store.js';
import { type Sight, sees } from '../org/org-owners.js';

/**
 * The local file of a catalog model served by llama.cpp: its source is a GGUF in this mirror. Training reads its
 * header (architecture, heads) to write the GGUF adapter, and its vocabulary to count the pairs' tokens.
 */
export async function catalogGguf(
  db: Db,
  mirror: MirrorService,
  modelName: string,
  sight?: Sight,
): Promise<{ ok: true; file: string; source: string } | { ok: false; reason: string }> {
  const model = await modelByName(db, modelName);
  // `sight`: asked for a caller, a model it may not call reads as none, in the same words (org-owners.ts `sees`).
  if (!model || (sight && !sees(sight, model.owner)))
    return { ok: false, reason: `the model ${modelName} is not in the catalog` };
  const url = model.source;
  const marker = url.indexOf('/mirror/');
  if (model.engine !== 'llamacpp' || marker < 0 || !url.endsWith('.gguf'))
    return { ok: false, reason: `${modelName}'s weights are not a GGUF in this mirror (${url})` };
  const [name = '', version = '', ...rest] = url
    .slice(marker + '/mirror/'.length)
    .split('/')
    .map(decodeURIComponent);
  const row = await mirrorFileRow(db, name, version, rest.join('/'));
  if (row?.state !== 'PRESENT') return { ok: false, reason: `${url} is not present in the mirror` };
  return { ok: true, file: mirror.paths.file(name, version, row.file), source: url };
}
