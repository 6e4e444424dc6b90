import type { Db } from '../db/client.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { presentFilesOfRepo } from '../mirror/mirror-store.js';
import type { RegistryService } from '../registry/registry.service.js';

// The base weights a trainer needs from a Hugging Face repository: the config, the safetensors shards and the
// tokenizer. Not the GGUFs, ONNX exports or original/ checkpoints some repositories also carry: those can be
// many times the size of what training reads.

export type BaseFile = { path: string; url: string; size: number | null; sha256: string | null };

const WANTED =
  /^(config\.json|generation_config\.json|model\.safetensors\.index\.json|[^/]+\.safetensors|tokenizer\.json|tokenizer_config\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json|vocab\.json|vocab\.txt|merges\.txt|chat_template\.jinja|chat_template\.json)$/;

/** Keeps what training reads; drops consolidated*.safetensors when the HF-format shards are there too (Mistral). */
export function selectBaseFiles<T extends { path: string }>(files: T[]): T[] {
  const top = files.filter((f) => !f.path.includes('/') && WANTED.test(f.path));
  const hf = top.some((f) => /^model.*\.safetensors$/.test(f.path));
  return top.filter((f) => !(hf && f.path.startsWith('consolidated')));
}

/**
 * A mirrored copy of the repository (every file PRESENT in one version, fetched from it), newest first. Only
 * files fetched from the Hub's origin: another server's answer to a path shaped like the repository's is not it.
 */
export async function baseFilesFromMirror(db: Db, mirror: MirrorService, repo: string): Promise<BaseFile[]> {
  const rows = (await presentFilesOfRepo(db, repo)).filter((r) => mirror.isHubUrl(r.sourceUrl));
  const byVersion = new Map<string, typeof rows>();
  for (const r of rows) {
    const key = `${r.model}\0${r.version}`;
    byVersion.set(key, [...(byVersion.get(key) ?? []), r]);
  }
  for (const files of byVersion.values()) {
    const picked = selectBaseFiles(files.map((f) => ({ ...f, path: f.file })));
    if (!picked.some((f) => f.path === 'config.json') || !picked.some((f) => f.path.endsWith('.safetensors'))) continue;
    return picked.map((f) => ({
      path: f.path,
      url: mirror.fileUrl(f),
      size: Number(f.bytesDone),
      sha256: f.actualSha256,
    }));
  }
  return [];
}

export type HubListing =
  | { ok: true; files: BaseFile[] }
  | { ok: false; kind: 'missing' | 'not-safetensors' | 'unreachable'; reason: string };

/** The repository's files on the registry, as the node will fetch them. */
export async function baseFilesFromHub(
  registry: RegistryService,
  repo: string,
  revision: string | null,
): Promise<HubListing> {
  const listed = await registry.listFiles(repo, revision);
  if (!listed.ok) return { ok: false, kind: listed.status === 404 ? 'missing' : 'unreachable', reason: listed.reason };
  const picked = selectBaseFiles(listed.files);
  if (!picked.some((f) => f.path.endsWith('.safetensors'))) {
    const gguf = listed.files.some((f) => f.path.endsWith('.gguf'));
    return {
      ok: false,
      kind: 'not-safetensors',
      reason: gguf
        ? `${repo} holds GGUF files, not safetensors weights: training needs the repository the GGUF was made from`
        : `${repo} has no .safetensors weights at its top level: training reads Hugging Face safetensors`,
    };
  }
  if (!picked.some((f) => f.path === 'config.json'))
    return { ok: false, kind: 'not-safetensors', reason: `${repo} has no config.json: it is not a transformers model` };
  return {
    ok: true,
    files: picked.map((f) => ({
      path: f.path,
      url: registry.fileUrl(repo, listed.revision, f.path),
      size: f.size,
      sha256: f.sha256,
    })),
  };
}
