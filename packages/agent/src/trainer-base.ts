import fs from 'node:fs/promises';
import path from 'node:path';
import type { DownloadOptions, TrainControl, TrainSpec } from './train-control.js';
import { messageOf } from './trainer-process.js';
import type { Progress } from './trainer-progress.js';

// A job's base weights, cached on the node by repository and revision: what a second job on the same base need
// not fetch again. Apart from the worker (trainer.ts) because it is its own rule: reuse only what was verified.

export type BaseOptions = {
  /** <agent dir>/train: the cache is base/<repo@revision>/ under it. */
  workDir: string;
  control: Pick<TrainControl, 'download'>;
  download?: Pick<DownloadOptions, 'attempts' | 'backoffMs' | 'stallMs'>;
};

/**
 * The base weights into <workDir>/base/<repo@revision>/, reusing each file already there with the size (and
 * sha256, when the spec gives one) the spec names: a second job on the same base fetches nothing.
 */
export async function fetchBase(
  o: BaseOptions,
  spec: TrainSpec,
  progress: Progress,
  signal: AbortSignal,
): Promise<string> {
  const dir = path.join(o.workDir, 'base', safeName(`${spec.base_repo}@${spec.base_revision ?? 'default'}`));
  await fs.mkdir(dir, { recursive: true });
  // Beside the directory, not in it: the trainer's base_dir holds the repository's files and nothing else.
  const manifestFile = `${dir}.json`;
  const manifest = await readManifest(manifestFile);
  const files = spec.base.files;
  let fetched = 0;
  for (const [i, f] of files.entries()) {
    const dest = path.resolve(dir, f.path);
    if (!dest.startsWith(`${dir}${path.sep}`)) throw new Error(`the base file ${f.path} would land outside ${dir}`);
    const had = manifest[f.path];
    const st = await fs.stat(dest).catch(() => undefined);
    const reusable =
      had &&
      st?.isFile() &&
      st.size === had.bytes &&
      (f.size == null || f.size === had.bytes) &&
      (f.sha256 == null || f.sha256 === had.sha256);
    if (reusable) continue;
    progress.setMessage(`fetching base weights ${i + 1}/${files.length}: ${f.path}`);
    try {
      const got = await o.control.download(f.url, dest, {
        ...o.download,
        sha256: f.sha256,
        bytes: f.size,
        signal,
      });
      manifest[f.path] = got;
    } catch (err) {
      signal.throwIfAborted();
      throw new Error(`the base weights could not be fetched (${f.path}): ${messageOf(err)}`);
    }
    // Written after each file: a run cut short keeps what it verified.
    await writeManifest(manifestFile, manifest);
    fetched++;
  }
  // Files of an older listing of this revision ("main" moved, shards renamed) would confuse the loader.
  const wanted = new Set(files.map((f) => f.path.split('/')[0]));
  for (const e of await fs.readdir(dir, { withFileTypes: true })) {
    if (wanted.has(e.name) || !e.isFile()) continue;
    await fs.rm(path.join(dir, e.name), { force: true });
    delete manifest[e.name];
  }
  await writeManifest(manifestFile, manifest);
  progress.event(
    'info',
    fetched === files.length
      ? `base weights of ${spec.base_repo}: fetched ${fetched} files`
      : fetched
        ? `base weights of ${spec.base_repo}: fetched ${fetched} of ${files.length} files, the rest from this node's cache`
        : `base weights of ${spec.base_repo}: all ${files.length} files from this node's cache`,
  );
  return dir;
}

/** Which base files the cache holds (<base>/<repo@revision>.json), as they were verified when fetched. */
type Manifest = Record<string, { bytes: number; sha256: string }>;

async function readManifest(file: string): Promise<Manifest> {
  try {
    const v = JSON.parse(await fs.readFile(file, 'utf8')) as unknown;
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Manifest) : {};
  } catch {
    return {};
  }
}

async function writeManifest(file: string, m: Manifest) {
  await fs.writeFile(`${file}.tmp`, JSON.stringify(m, null, 2));
  await fs.rename(`${file}.tmp`, file);
}

/** A name for a directory from a repository and revision, or a job id: no separators, no dot-names. */
export function safeName(s: string) {
  const name = s
    .replace(/\//g, '--')
    .replace(/[^A-Za-z0-9._@-]/g, '_')
    .slice(0, 200);
  return name.startsWith('.') ? `_${name}` : name;
}
