import { z } from 'zod';
import type { MirrorFile } from '../generated/prisma/client.js';
import { fileName, modelName, versionName } from './paths.js';
import { type VersionProgress, type VersionState, versionProgress, versionState } from './progress.js';

// What the parts of the mirror service (mirror-reads, space, mirror-landing, mirror-worker, mirror.service) share:
// the shapes of its inputs and answers, and the pure functions over them. mirror.service.ts exports them on.

/** The states of a file still on its way: what the disk must keep room for. */
export const ACTIVE = ['QUEUED', 'FETCHING', 'VERIFYING'] as const;
/** What a row says once its transfer is not waiting to try again. */
export const NO_RETRY = { retryAttempt: null, retryAt: null, retryReason: null } as const;

export const sha256 = z
  .string()
  .regex(/^[0-9a-fA-F]{64}$/, 'a sha256 is 64 hexadecimal characters')
  .transform((s) => s.toLowerCase());

export const sourceInput = z.object({
  url: z
    .string()
    .url('an absolute URL')
    .refine((u) => /^https?:\/\//.test(u), 'an http:// or https:// URL'),
  file: fileName.nullish(),
  sha256: sha256.nullish(),
  size: z.number().int().min(0, 'a size in bytes, 0 or more').nullish(),
});

export const fetchInput = z.object({
  model: modelName,
  version: versionName,
  sources: z.array(sourceInput).min(1, 'at least one source').max(1000, 'at most 1000 files in one version'),
  force: z.boolean().nullish(),
  fetchAnyway: z.boolean().nullish(),
});

export const nameInput = z.object({ model: modelName, version: versionName });

export type MirrorVersionView = {
  model: string;
  version: string;
  files: MirrorFile[];
  state: VersionState;
  progress: VersionProgress;
  /** A removed version, as the last event about it says. */
  removed: boolean;
};

/** What reading a file's header before its fetch found (registry/look.ts). */
export type SourceCheck = {
  /** Why the nodes' llama.cpp cannot load it; null when they can, or when the header was out of reach. */
  refusal: string | null;
  /** One line for the answer: what the file is, or why it was not checked. */
  note: string;
};
export type LookBeforeFetch = (files: { url: string; file: string }[]) => Promise<SourceCheck[]>;

export type FetchStarted = {
  version: MirrorVersionView;
  started: number;
  alreadyArriving: number;
  alreadyPresent: number;
  message: string;
};

/**
 * Whether a URL is on the Hub's origin (HANGAR_HUB_URL): only what was fetched from there is a Hub repository's
 * file (for /hf, and for training's base weights), so those bytes must be ones the Hub answered for, never only
 * a digest someone claimed, nor another server's answer to a path shaped like the Hub's.
 */
export function isHubUrl(hubUrl: string | null, url: string): boolean {
  if (!hubUrl) return false;
  try {
    return new URL(url).origin === new URL(hubUrl).origin;
  } catch {
    return false;
  }
}

export function versionKey(model: string, version: string) {
  return `${model}/${version}`;
}

/** A catalog model or adapter whose source is in a version, with the scaling of the replicas that load it. */
export type VersionUse = {
  name: string;
  minReplicas: number;
  maxReplicas: number;
  declared: boolean;
  /** For an adapter, the catalog model it runs on; null for a model. */
  adapterOf: string | null;
  /** Who must admit a caller for it to see this use: the model's owner, and an adapter's own (none: everyone). */
  owners: string[];
};

/** A version as a source URL spells it (names URL-encoded): the key usesByVersion answers by. */
export function sourceKey(model: string, version: string) {
  return `${encodeURIComponent(model)}/${encodeURIComponent(version)}`;
}

/**
 * Every version a source URL points into: each "/mirror/<model>/<version>/" in it, as sourceKeys. The same
 * versions a search for that text finds, so a source named twice (a proxy's path before ours) counts for both.
 */
export function mirrorVersionsIn(source: string): Set<string> {
  const keys = new Set<string>();
  for (let from = source.indexOf('/mirror/'); from >= 0; from = source.indexOf('/mirror/', from + 1)) {
    const m = /^\/mirror\/([^/]+)\/([^/]+)\//.exec(source.slice(from));
    if (m) keys.add(`${m[1]}/${m[2]}`);
  }
  return keys;
}

export function view(files: MirrorFile[]): MirrorVersionView {
  const first = files[0] as MirrorFile;
  return {
    model: first.model,
    version: first.version,
    files,
    state: versionState(files),
    progress: versionProgress(files),
    removed: false,
  };
}
