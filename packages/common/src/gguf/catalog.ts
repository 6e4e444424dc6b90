import architectures from './data/architectures.json' with { type: 'json' };
import quantTypes from './data/quant-types.json' with { type: 'json' };

// llama.cpp's own tables, read from its source history (see data/): which build first loads each architecture,
// and the tensor and file types with their block sizes. Kept as data so a newer llama.cpp is a data update.

type Arch = { arch: string; since_build: number; impl_build?: number | null; note?: string };
type Removed = { arch: string; removed_build?: number; since_build?: number; note?: string };

export const newestBuild: number = architectures.newest_build;

const archs = new Map<string, Arch>((architectures.architectures as Arch[]).map((a) => [a.arch, a]));
const removed = new Map<string, Removed>(
  ((architectures as { removed?: Removed[] }).removed ?? []).map((r) => [r.arch, r]),
);

export function architecture(name: string): Arch | undefined {
  return archs.get(name);
}
export function removedArchitecture(name: string): Removed | undefined {
  return removed.get(name);
}

type GgmlType = { ggml_type: string; id: number; block_size: number; type_size_bytes: number };
const ggml = new Map<number, GgmlType>(
  (quantTypes.ggml_types as GgmlType[]).filter((t) => t.block_size > 0).map((t) => [t.id, t]),
);
export const knownTensorTypes: ReadonlySet<number> = new Set(ggml.keys());

export function tensorBytes(type: number, elements: number): number {
  const t = ggml.get(type);
  if (!t) return 0;
  return Math.ceil(elements / t.block_size) * t.type_size_bytes;
}

type FileType = { id: number; file_name_token: string };
const fileTypes = new Map<number, string>(
  (quantTypes.llama_ftypes as FileType[]).map((f) => [f.id, f.file_name_token]),
);
export const fileTypeTokens: ReadonlySet<string> = new Set(fileTypes.values());

/** `general.file_type` as the name files carry: 15 → Q4_K_M. */
export function fileTypeName(id: number): string | undefined {
  return fileTypes.get(id);
}
