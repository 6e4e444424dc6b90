import { knownTensorTypes } from '@hangar/common/gguf/catalog';
import { factsOf } from '@hangar/common/gguf/facts';
import { readGguf } from '@hangar/common/gguf/reader';
import { type ByteSource, fileSource } from '@hangar/common/gguf/source';
import { headerKind } from '../registry/look.js';

// What a mirrored version holds, read from its files' own headers (general.type, adapter.type, a clip
// architecture), never guessed from their names: a published LoRA adapter offered "Serve" as a model, the plan
// said it fits, and the node then failed it with "key not found in model: llama.context_length".

export type FileKind = 'MODEL' | 'ADAPTER' | 'MMPROJ' | 'IMATRIX' | 'OTHER';
export type VersionKind = 'MODEL' | 'ADAPTER' | 'MMPROJ' | 'IMATRIX' | 'UNKNOWN';

/** The columns a file's header reading fills (MirrorFile.kind and .architecture). */
export type FileWhat = { kind: FileKind | null; architecture: string | null };

type KindFile = { file: string; state: string; kind: string | null; architecture: string | null };

const isGguf = (file: string) => /\.gguf$/i.test(file);
/** A split model's later shards carry no metadata of their own; the first says what they all are. */
const laterShard = (file: string) => /-(?!0*1-)\d{5}-of-\d{5}\.gguf$/i.test(file);

/**
 * What a verified file on disk holds. A GGUF is read for its header (a few KiB to a few MiB); a PEFT directory's
 * adapter_config.json marks an adapter for vLLM; anything else is OTHER. A header that cannot be read leaves the
 * kind null: it is read again next time rather than recorded as something it may not be.
 */
export async function readFileKind(onDisk: string, file: string): Promise<FileWhat> {
  return readKindFrom(() => fileSource(onDisk), file);
}

/** readFileKind from any source of the file's bytes (a bucket's blob read by range: on-bucket.ts). */
export async function readKindFrom(open: () => Promise<ByteSource>, file: string): Promise<FileWhat> {
  if (!isGguf(file))
    return { kind: /(^|\/)adapter_config\.json$/.test(file) ? 'ADAPTER' : 'OTHER', architecture: null };
  if (laterShard(file)) return { kind: 'OTHER', architecture: null };
  const src = await open().catch(() => null);
  if (!src) return { kind: null, architecture: null };
  try {
    const facts = factsOf(await readGguf(src, knownTensorTypes));
    return { kind: headerKind(facts), architecture: facts.architecture };
  } catch {
    return { kind: null, architecture: null };
  } finally {
    await src.close();
  }
}

/**
 * A version's kind from its files': weights when any file is a model (a projector or an importance matrix beside
 * one does not change what it is); otherwise an adapter, a projector or an importance matrix. Safetensors without
 * a GGUF are a model's weights for vLLM, unless they are a PEFT adapter. UNKNOWN until every file is present and
 * read.
 */
export function versionKindOf(files: readonly KindFile[]): VersionKind {
  if (!files.length || files.some((f) => f.state !== 'PRESENT' || f.kind === null)) return 'UNKNOWN';
  const kinds = new Set(files.map((f) => f.kind));
  if (kinds.has('MODEL')) return 'MODEL';
  if (kinds.has('ADAPTER')) return 'ADAPTER';
  if (kinds.has('MMPROJ')) return 'MMPROJ';
  if (kinds.has('IMATRIX')) return 'IMATRIX';
  return files.some((f) => isGguf(f.file)) ? 'UNKNOWN' : 'MODEL';
}

/** The architecture a version's main file names (an adapter's: the base it is for). */
export function versionArchitecture(files: readonly KindFile[]): string | null {
  const kind = versionKindOf(files);
  return files.find((f) => f.kind === kind && f.architecture)?.architecture ?? null;
}

/** Why a version of this kind is not served as a model, or null when it is weights. */
export function notAModel(kind: VersionKind, architecture: string | null, adapterOf: readonly string[]): string | null {
  switch (kind) {
    case 'ADAPTER': {
      const base = adapterOf.length ? adapterOf.join(', ') : (architecture ?? 'a base model');
      const where = adapterOf.length
        ? `it is already attached to ${adapterOf.join(', ')}: call it by its name there`
        : "publish it to its model instead (the training job's Publish), or attach it to a model in the catalog";
      return `this version holds a LoRA adapter for ${base}, not a model's weights: ${where}`;
    }
    case 'MMPROJ':
      return 'this version holds a vision projector (mmproj), not a model: it is loaded beside a model with --mmproj';
    case 'IMATRIX':
      return 'this version holds an importance matrix, input to quantisation, not a model';
    default:
      return null;
  }
}
