import path from 'node:path';
import { z } from 'zod';
import { resourceName } from '../lib/names.js';

export const modelName = resourceName('a model name');
export const versionName = resourceName('a version');

// A file may sit in folders, as on the Hub ("Q4_K_M/model-00001-of-00002.gguf"), but never climb out of its
// version: each part is a plain name.
export const fileName = z
  .string()
  .min(1, 'a file name')
  .max(300, 'at most 300 characters')
  .refine(
    (f) =>
      f.split('/').length <= 4 &&
      f.split('/').every((part) => /^[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}$/.test(part) && part !== '..'),
    "a file name is letters, digits, '.', '_', '+' and '-', in at most 4 folder levels separated by '/': no '..', no leading '/' or '.'",
  );

/** Where the mirror keeps things under the data dir. Nothing half-written is ever under `files`. */
export class MirrorPaths {
  readonly root: string;
  readonly files: string;
  readonly partials: string;
  /** The storage's id, written once when the storage is first used: see storage.ts. */
  readonly storageIdFile: string;
  constructor(dataDir: string) {
    this.root = path.join(dataDir, 'mirror');
    this.files = path.join(this.root, 'files');
    this.partials = path.join(this.root, 'partial');
    this.storageIdFile = path.join(this.root, '.hangar-storage-id');
  }
  version(model: string, version: string) {
    return path.join(this.files, model, version);
  }
  file(model: string, version: string, file: string) {
    return path.join(this.files, model, version, ...file.split('/'));
  }
  /** Named by the row's id, so a restart finds it again whatever the file is called. */
  partial(id: string) {
    return path.join(this.partials, `${id}.part`);
  }
}

/** The name a URL's last path segment suggests, when a source does not name its file. */
export function fileFromUrl(url: string): string | undefined {
  try {
    const last = new URL(url).pathname.split('/').filter(Boolean).at(-1);
    return last ? decodeURIComponent(last) : undefined;
  } catch {
    return undefined;
  }
}
