import { fileTypeTokens } from '@hangar/common/gguf/catalog';

// A repository's files grouped into what can be fetched: a file, or every shard of one, as one set. A
// fifteen-shard model is one decision, not fifteen; a vision projector or an importance matrix is its own set
// and never offered as a model; READMEs, configs and tokenizers are not weights and are left out.

export type RepoFile = { path: string; size: number; sha256: string | null };

/** From the names while grouping; the explorer replaces it with what each set's header says (registry/look.ts). */
export type SetKind = 'MODEL' | 'ADAPTER' | 'MMPROJ' | 'IMATRIX';
export type SetFormat = 'GGUF' | 'SAFETENSORS';

export type FileSet = {
  /** Stable within a revision: what fetchRepoSet names. */
  id: string;
  kind: SetKind;
  format: SetFormat;
  /** Q4_K_M, Q8_0, F16, … for GGUF; null when the name carries none. */
  quant: string | null;
  files: RepoFile[];
  totalBytes: number;
  /** For shard sets: how many the names say there are, and whether all are here. */
  shardCount: number;
  complete: boolean;
};

const SHARD = /^(.*)-(\d{5})-of-(\d{5})$/;
const QUANT_EXTRA = /^(I?Q\d[A-Z0-9_]*|F16|F32|BF16|MXFP4(_MOE)?|TQ\d_\d|UD-[A-Z0-9_]+)$/i;

function quantOf(stem: string, folder: string | null): string | null {
  const token = stem.match(/[-._]((?:UD-)?[A-Za-z0-9_]+)$/)?.[1] ?? '';
  const upper = token.toUpperCase();
  if (fileTypeTokens.has(upper) || QUANT_EXTRA.test(upper)) return upper;
  // Some repositories keep each quantisation in its own folder: Q4_K_M/model-00001-of-00002.gguf.
  const f = folder?.split('/').at(-1)?.toUpperCase() ?? null;
  if (f && (fileTypeTokens.has(f) || QUANT_EXTRA.test(f))) return f;
  // Imatrix-style names: Model.Q4_K_M.gguf
  const dotted = stem.split('.').at(-1)?.toUpperCase();
  if (dotted && fileTypeTokens.has(dotted)) return dotted;
  return null;
}

export function groupSets(files: RepoFile[]): FileSet[] {
  const groups = new Map<
    string,
    { kind: SetKind; format: SetFormat; quant: string | null; files: RepoFile[]; shardCount: number }
  >();
  const add = (
    key: string,
    init: () => { kind: SetKind; format: SetFormat; quant: string | null; shardCount: number },
    f: RepoFile,
  ) => {
    let g = groups.get(key);
    if (!g) {
      g = { ...init(), files: [] };
      groups.set(key, g);
    }
    g.files.push(f);
  };
  for (const f of files) {
    const lower = f.path.toLowerCase();
    const base = f.path.split('/').at(-1) ?? f.path;
    const folder = f.path.includes('/') ? f.path.slice(0, f.path.lastIndexOf('/')) : null;
    if (lower.endsWith('.gguf')) {
      const stem = base.slice(0, -'.gguf'.length);
      const shard = stem.match(SHARD);
      const prefix = shard ? (shard[1] ?? stem) : stem;
      const kind: SetKind = /mmproj/i.test(base) ? 'MMPROJ' : /imatrix/i.test(base) ? 'IMATRIX' : 'MODEL';
      const quant = quantOf(prefix, folder);
      const key = `gguf:${kind}:${folder ?? ''}/${prefix}`;
      add(key, () => ({ kind, format: 'GGUF', quant, shardCount: shard ? Number(shard[3]) : 1 }), f);
    } else if (/imatrix/i.test(base) && /\.(dat|gguf)$/i.test(base)) {
      add(`imatrix:${f.path}`, () => ({ kind: 'IMATRIX', format: 'GGUF', quant: null, shardCount: 1 }), f);
    } else if (lower.endsWith('.safetensors') && !/adapter_model/i.test(base)) {
      const stem = base.slice(0, -'.safetensors'.length);
      const shard = stem.match(SHARD);
      const key = `safetensors:${folder ?? ''}/${shard ? shard[1] : stem}`;
      add(
        key,
        () => ({ kind: 'MODEL', format: 'SAFETENSORS', quant: null, shardCount: shard ? Number(shard[3]) : 1 }),
        f,
      );
    }
  }
  const sets: FileSet[] = [];
  for (const [key, g] of groups) {
    g.files.sort((a, b) => a.path.localeCompare(b.path));
    const id = setId(key, g);
    sets.push({
      id,
      kind: g.kind,
      format: g.format,
      quant: g.quant,
      files: g.files,
      totalBytes: g.files.reduce((n, f) => n + f.size, 0),
      shardCount: g.shardCount,
      complete: g.files.length === g.shardCount,
    });
  }
  // Models first, by size (small quantisations first, as people scan for what fits), then the side files.
  const rank: Record<SetKind, number> = { MODEL: 0, ADAPTER: 1, MMPROJ: 2, IMATRIX: 3 };
  return sets.sort((a, b) => rank[a.kind] - rank[b.kind] || a.totalBytes - b.totalBytes || a.id.localeCompare(b.id));
}

/** A readable id: the quantisation when it names the set alone, else the file (or shard prefix). */
function setId(key: string, g: { kind: SetKind; format: SetFormat; quant: string | null; files: RepoFile[] }) {
  const first = g.files[0]?.path ?? key;
  const prefix = first.replace(/-\d{5}-of-\d{5}(?=\.[a-z]+$)/i, '').replace(/\.(gguf|safetensors)$/i, '');
  if (g.format === 'SAFETENSORS') return `safetensors:${prefix}`;
  return `${g.kind.toLowerCase()}:${prefix}`;
}

/** What a repository suggests as a catalog name: its last part, lower-cased, without the GGUF marker. */
export function suggestedModelName(repo: string): string {
  const last = repo.split('/').at(-1) ?? repo;
  return last
    .replace(/[-_.]gguf$/i, '')
    .toLowerCase()
    .replace(/[^a-z0-9._-]/g, '-');
}

/**
 * A version per set: the revision (short commit) and what the set is, `3f2a1b7-q4_k_m`. The commit rather than
 * the branch: two fetches of one commit land in one place, and a branch re-uploaded lands somewhere else. A set
 * that still shares its version with another (two Q4_K_M files in different folders) gets its file's name
 * instead, and a number as the last resort. A label, not a verdict: what a set is comes from its header.
 */
export function suggestedVersions(
  revision: string,
  sets: (FileSet & { facts?: { fileType: string | null } | null })[],
): string[] {
  const short = revision.slice(0, 7);
  const slug = (text: string) =>
    text
      .toLowerCase()
      .replace(/[^a-z0-9._-]+/g, '-')
      .replace(/\.{2,}/g, '.')
      .replace(/[-._]+$/, '')
      .slice(0, 95);
  // The file (or shard prefix) the id names: "model:Q4_K_M/Qwen3-8B-Q4_K_M" → "Qwen3-8B-Q4_K_M".
  const fileOf = (s: FileSet) =>
    s.id
      .slice(s.id.indexOf(':') + 1)
      .split('/')
      .at(-1) ?? s.id;
  const first = sets.map((s) => {
    // The name's quantisation first: it is the label the operator picked the set by (the header's where none).
    const quant = s.quant ?? s.facts?.fileType ?? null;
    const what = [s.kind === 'MODEL' ? null : s.kind.toLowerCase(), quant && /^[\w-]+$/.test(quant) ? quant : null]
      .filter(Boolean)
      .join('-');
    return slug(`${short}-${what || fileOf(s)}`);
  });
  const taken = (v: string) => first.filter((x) => x === v).length > 1;
  const second = sets.map((s, i) => (taken(first[i] as string) ? slug(`${short}-${fileOf(s)}`) : (first[i] as string)));
  const seen = new Map<string, number>();
  return second.map((v) => {
    const n = (seen.get(v) ?? 0) + 1;
    seen.set(v, n);
    return n === 1 ? v : `${v}-${n}`;
  });
}

// What vLLM reads beside the weights of a safetensors model: without config.json and the tokenizer a mirrored
// set is bytes no engine can start from, so a fetch of such a set takes these from the same folder.
const VLLM_SIDE_FILE =
  /^(config\.json|generation_config\.json|tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json|vocab\.json|merges\.txt|chat_template\.(jinja|json)|preprocessor_config\.json|.*\.safetensors\.index\.json)$/;

/** The files vLLM needs beside a safetensors set's weights, from the folder its first file is in. */
export function vllmSideFiles(files: RepoFile[], set: Pick<FileSet, 'files'>): RepoFile[] {
  const first = set.files[0]?.path ?? '';
  const folder = first.includes('/') ? first.slice(0, first.lastIndexOf('/') + 1) : '';
  return files.filter((f) => {
    if (!f.path.startsWith(folder)) return false;
    const rest = f.path.slice(folder.length);
    return !rest.includes('/') && VLLM_SIDE_FILE.test(rest);
  });
}
