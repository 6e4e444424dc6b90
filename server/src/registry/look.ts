import { knownTensorTypes, newestBuild } from '@hangar/common/gguf/catalog';
import { factsOf, type ModelFacts } from '@hangar/common/gguf/facts';
import { GgufError, readGguf } from '@hangar/common/gguf/reader';
import { httpSource, SourceError } from '@hangar/common/gguf/source';
import { type Verdict, verdictFor } from '@hangar/common/gguf/verdict';
import { hubAuthorization } from '@hangar/common/outbound';
import type { Config } from '../config.js';
import type { FleetService } from '../fleet/fleet.service.js';

// What a GGUF is, and whether the nodes' llama.cpp loads it, read from its header over Range (a few hundred KiB
// to a few MiB of a file of gigabytes) before anything is downloaded. One reader for the registry explorer and
// for a fetch by URL, so the two never disagree about the same file. Never from its name: "imatrix" in a file
// name is as likely to mean "quantised with an importance matrix" as "is one".

/** What a header says a file is; `general.type` where it is written, the architecture where it is not. */
export type HeaderKind = 'MODEL' | 'ADAPTER' | 'MMPROJ' | 'IMATRIX';

export type Build = { build: number; source: string };

export function headerKind(facts: ModelFacts): HeaderKind {
  const type = facts.type?.toLowerCase() ?? null;
  if (type === 'adapter') return 'ADAPTER';
  if (type === 'imatrix') return 'IMATRIX';
  if (type === 'mmproj' || facts.architecture === 'clip') return 'MMPROJ';
  return 'MODEL';
}

/** Whether a file of this kind runs as a model on the nodes (the explorer's Fetch and Serve offers). */
export function servingVerdict(facts: ModelFacts, kind: HeaderKind, build: Build): Verdict {
  const none = (reason: string): Verdict => ({ servable: false, reason, neededBuild: null });
  if (kind === 'ADAPTER') return none('a LoRA adapter: loaded on top of its base model, not as one');
  if (kind === 'IMATRIX') return none('an importance matrix: input to quantisation, not a model');
  // llama.cpp's own word for what a clip file is (gguf/verdict.ts), whatever its general.type says.
  if (kind === 'MMPROJ') return verdictFor('clip', build.build, build.source);
  if (facts.splitIndex !== null && facts.splitIndex > 0)
    return none(`shard ${facts.splitIndex + 1} of a split model: the first shard carries what the model is`);
  return verdictFor(facts.architecture, build.build, build.source);
}

/**
 * Why the nodes could not load this file at all, as what it is, or null when they can. Looser than
 * servingVerdict: a projector, an adapter of a known architecture or an importance matrix is a fine thing to
 * mirror; a model of an architecture the nodes' llama.cpp does not know is an hour of download for nothing.
 */
export function loadRefusal(facts: ModelFacts, kind: HeaderKind, build: Build): string | null {
  if (kind === 'MMPROJ' || kind === 'IMATRIX') return null;
  if (facts.splitIndex !== null && facts.splitIndex > 0) return null;
  const v = verdictFor(facts.architecture, build.build, build.source);
  if (v.servable) return null;
  return kind === 'ADAPTER'
    ? `a LoRA adapter for ${facts.architecture ?? 'no named architecture'}: ${v.reason}`
    : v.reason;
}

export type SourceLook =
  | {
      read: true;
      file: string;
      facts: ModelFacts;
      kind: HeaderKind;
      refusal: string | null;
      note: string;
      bytesRead: number;
    }
  /** The header said it is no GGUF llama.cpp reads (wrong magic, an unknown tensor type, a hostile header). */
  | { read: true; file: string; facts: null; kind: null; refusal: string; note: string; bytesRead: number }
  /** The header was out of reach (refused, unreachable, no Range): the download itself will say what is wrong. */
  | { read: false; file: string; facts: null; kind: null; refusal: null; note: string; bytesRead: number };

/** Reads headers with the server's outbound rules (HANGAR_FETCH_ALLOW) and the Hub's token for the Hub only. */
export class HeaderReader {
  constructor(
    private readonly o: {
      config: Pick<Config, 'hubUrl' | 'hubToken' | 'hubTimeoutMs' | 'llamaCppBuild'>;
      fleet: Pick<FleetService, 'llamaCppBuild'>;
      /** guardedFetch: each redirect hop checked against HANGAR_FETCH_ALLOW, as the download's are. */
      fetch: typeof fetch;
    },
  ) {}

  /** The llama.cpp the nodes run: the oldest an online node reports, else HANGAR_LLAMACPP_BUILD or the newest known. */
  build(): Promise<Build> {
    return this.o.fleet.llamaCppBuild(this.o.config.llamaCppBuild ?? newestBuild);
  }

  /** A header and what it took to read it; throws GgufError (what the bytes say) or SourceError/others (reaching them). */
  async read(url: string, headers?: Record<string, string>) {
    const src = httpSource(
      url,
      headers ?? hubAuthorization(url, this.o.config),
      this.o.config.hubTimeoutMs,
      this.o.fetch,
    );
    try {
      return { facts: factsOf(await readGguf(src, knownTensorTypes)), bytesRead: src.bytesRead };
    } catch (err) {
      (err as { bytesRead?: number }).bytesRead = src.bytesRead;
      throw err;
    }
  }

  /** The look before a fetch by URL: what the file is and whether the nodes can load it. */
  async look(
    file: string,
    build: Build,
    read: () => Promise<{ facts: ModelFacts; bytesRead: number }>,
  ): Promise<SourceLook> {
    try {
      const { facts, bytesRead } = await read();
      const kind = headerKind(facts);
      const refusal = loadRefusal(facts, kind, build);
      return { read: true, file, facts, kind, refusal, note: describe(facts, kind, build), bytesRead };
    } catch (err) {
      const bytesRead = (err as { bytesRead?: number }).bytesRead ?? 0;
      if (err instanceof GgufError) {
        return {
          read: true,
          file,
          facts: null,
          kind: null,
          refusal: `not a GGUF llama.cpp loads: ${err.message}`,
          note: err.message,
          bytesRead,
        };
      }
      const why = err instanceof SourceError ? err.message : `its header could not be read: ${reachError(err)}`;
      return { read: false, file, facts: null, kind: null, refusal: null, note: `not checked (${why})`, bytesRead };
    }
  }
}

function reachError(err: unknown): string {
  const e = err as Error & { cause?: { code?: string; message?: string } };
  if (e.name === 'TimeoutError' || e.name === 'AbortError') return 'no answer in time';
  return e.cause?.code ?? e.cause?.message ?? e.message;
}

/** One line an operator reads beside the fetch: "llama, Q4_K_M, 80 layers: loads in llama.cpp b…". */
function describe(facts: ModelFacts, kind: HeaderKind, build: Build): string {
  const what = [facts.architecture ?? 'no architecture', facts.fileType, facts.layers ? `${facts.layers} layers` : null]
    .filter(Boolean)
    .join(', ');
  switch (kind) {
    case 'ADAPTER':
      return `a LoRA adapter (${what})`;
    case 'MMPROJ':
      return `a vision projector (${what}), loaded beside a model`;
    case 'IMATRIX':
      return 'an importance matrix, for quantising';
    default: {
      if (facts.splitIndex !== null && facts.splitIndex > 0) return `shard ${facts.splitIndex + 1} of a split model`;
      const v = verdictFor(facts.architecture, build.build, build.source);
      return `${what}: ${v.reason}`;
    }
  }
}
