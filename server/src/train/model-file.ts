import fs from 'node:fs/promises';
import type { ByteSource } from '@hangar/common/gguf/source';
import { modelByName } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { mirrorFileRow } from '../mirror/mirror-store.js';
import { type Sight, sees } from '../org/org-owners.js';

/** A catalog model's GGUF in this mirror, wherever its bytes are kept (the data dir, or a bucket). */
export type CatalogGguf = {
  ok: true;
  /** Its /mirror URL, as the catalog names it. */
  source: string;
  /** Its bytes by offset (the header: architecture, heads, tensor shapes), ranged reads on a bucket. */
  bytes(): Promise<ByteSource>;
  /**
   * A file to open by path (llama.cpp's tokenizer reads one): the mirror's own file, or on a bucket this
   * replica's verified local copy (fetched whole the first time: the model's size in the data dir's cache).
   */
  file(): Promise<string>;
  /** Its size in bytes. */
  size(): Promise<number>;
};

/**
 * The GGUF of a catalog model served by llama.cpp: its source is a GGUF in this mirror. Training reads its
 * header (architecture, heads) to write the GGUF adapter and check one before publishing, and its vocabulary to
 * count the pairs' tokens.
 */
export async function catalogGguf(
  db: Db,
  mirror: MirrorService,
  modelName: string,
  sight?: Sight,
): Promise<CatalogGguf | { ok: false; reason: string }> {
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
  const copies = mirror.localCopies;
  const sha256 = row.actualSha256;
  if (copies && !sha256)
    return { ok: false, reason: `${url} has no sha256 recorded, so it cannot be found in the bucket` };
  const onDisk = mirror.paths.file(name, version, row.file);
  return {
    ok: true,
    source: url,
    bytes: () => mirror.openBytes(row),
    file: () => (copies && sha256 ? copies.copy(sha256) : Promise.resolve(onDisk)),
    size: async () => (copies ? Number(row.bytesDone) : (await fs.stat(onDisk)).size),
  };
}
