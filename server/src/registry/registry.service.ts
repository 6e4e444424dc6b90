import { z } from 'zod';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import type { FleetService } from '../fleet/fleet.service.js';
import { freeMiB } from '../fleet/placement.js';
import { knownTensorTypes, newestBuild } from '../gguf/catalog.js';
import { factsOf, type ModelFacts } from '../gguf/facts.js';
import { estimateMemory, type MemoryEstimate } from '../gguf/memory.js';
import { GgufError, readGguf } from '../gguf/reader.js';
import { httpSource, SourceError } from '../gguf/source.js';
import { type Verdict, verdictFor } from '../gguf/verdict.js';
import {
  ConflictError,
  ForbiddenError,
  fail,
  NotFoundError,
  ok,
  type Result,
  UpstreamError,
  ValidationError,
} from '../lib/errors.js';
import { guardedFetch } from '../lib/outbound.js';
import { parseInput } from '../lib/validate.js';
import type { FetchStarted, MirrorService } from '../mirror/mirror.service.js';
import { modelName, versionName } from '../mirror/paths.js';
import { renderCard } from './card.js';
import { Hub, HubError, type HubModel } from './hub.js';
import { type FileSet, groupSets, type RepoFile, suggestedModelName } from './sets.js';

export type NodeFit = { node: string; fits: boolean; freeMiB: number; neededMiB: number; reason: string };
export type JudgedSet = FileSet & {
  model: string;
  version: string;
  facts: ModelFacts | null;
  headerError: string | null;
  headerBytesRead: number;
  verdict: Verdict;
  memory: MemoryEstimate | null;
  fits: { disk: { fits: boolean; freeBytes: number; neededBytes: number }; nodes: NodeFit[]; summary: string };
};
export type RegistryRepo = {
  id: string;
  revision: string;
  shortRevision: string;
  gated: boolean;
  /** Null when the files can be downloaded; otherwise why not (gated without access). */
  noAccess: string | null;
  architecture: string | null;
  url: string;
  cardHtml: string | null;
  sets: JudgedSet[];
  context: number | null;
};

const repoId = z
  .string()
  .trim()
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*$/,
    'a repository is owner/name, such as Qwen/Qwen3-8B-GGUF',
  );
const revision = z
  .string()
  .trim()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$/, 'a revision is a branch, a tag or a commit hash')
  .nullish();

const CACHE_MS = 60_000;

export class RegistryService {
  private readonly hub: Hub;
  /** The Hub's redirects (to its CDN) are followed only into networks HANGAR_FETCH_ALLOW admits. */
  private readonly hubFetch: typeof fetch;
  private readonly cache = new Map<string, { at: number; value: Promise<unknown> }>();

  constructor(
    private readonly config: Config,
    private readonly fleet: FleetService,
    private readonly mirror: MirrorService,
  ) {
    this.hubFetch = guardedFetch(mirror.outbound);
    this.hub = new Hub({
      hubUrl: config.hubUrl,
      token: config.hubToken,
      timeoutMs: config.hubTimeoutMs,
      fetch: this.hubFetch,
    });
  }

  get siteUrl() {
    return this.config.hubUrl;
  }

  /** Answers are kept briefly: an operator paging back and forth should not wait on the registry each time. */
  private cached<T>(key: string, load: () => Promise<T>): Promise<T> {
    const hit = this.cache.get(key);
    if (hit && Date.now() - hit.at < CACHE_MS) return hit.value as Promise<T>;
    const value = load();
    this.cache.set(key, { at: Date.now(), value });
    value.catch(() => this.cache.delete(key));
    if (this.cache.size > 500) this.cache.delete(this.cache.keys().next().value as string);
    return value;
  }

  /**
   * A repository's files at a revision (resolved to its commit), for training's base weights. `status` is the
   * registry's HTTP status when it answered no (404: no such repository), absent when it could not be reached.
   */
  async listFiles(
    id: string,
    revision: string | null,
  ): Promise<{ ok: true; revision: string; files: RepoFile[] } | { ok: false; status?: number; reason: string }> {
    try {
      const repo = await this.cached(`repo:${id}:${revision ?? ''}`, () => this.hub.repo(id, revision ?? undefined));
      const files = await this.cached(`tree:${id}:${repo.sha}`, () => this.hub.files(id, repo.sha));
      return { ok: true, revision: repo.sha, files };
    } catch (err) {
      if (err instanceof HubError) return { ok: false, status: err.status, reason: err.message };
      return { ok: false, reason: (err as Error).message };
    }
  }

  fileUrl(id: string, revision: string, path: string) {
    return this.hub.resolveUrl(id, revision, path);
  }

  async search(input: {
    query?: string | null;
    sort?: string | null;
    first?: number | null;
    after?: string | null;
  }): Promise<Result<{ models: HubModel[]; hasNextPage: boolean; endCursor: string | null }>> {
    const first = Math.min(Math.max(input.first ?? 20, 1), 100);
    const offset = input.after && /^\d+$/.test(input.after) ? Number(input.after) : 0;
    if (offset > 1000)
      return fail(new ValidationError('after', 'after: paging stops at 1000 results; narrow the search'));
    const sort = (['downloads', 'likes', 'lastModified'] as const).find((s) => s === input.sort) ?? 'downloads';
    const query = (input.query ?? '').trim().slice(0, 200);
    try {
      const all = await this.cached(`search:${query}:${sort}:${offset + first + 1}`, () =>
        this.hub.search(query, sort, offset + first + 1),
      );
      const models = all.slice(offset, offset + first);
      return ok({
        models,
        hasNextPage: all.length > offset + first,
        endCursor: models.length ? String(offset + models.length) : null,
      });
    } catch (err) {
      return fail(new UpstreamError(err instanceof HubError ? err.message : 'the registry failed'));
    }
  }

  async repo(input: { id: string; revision?: string | null; context?: number | null }): Promise<Result<RegistryRepo>> {
    const parsed = parseInput(
      z.object({ id: repoId, revision, context: z.number().int().min(256).max(4_194_304).nullish() }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const { id, context } = parsed.value;
    try {
      const repo = await this.cached(`repo:${id}:${parsed.value.revision ?? ''}`, () =>
        this.hub.repo(id, parsed.value.revision ?? undefined),
      );
      const rev = repo.sha;
      const [files, readme] = await this.cached(`files:${id}:${rev}`, () =>
        Promise.all([this.hub.files(id, rev), this.hub.readme(id, rev)]),
      );
      const sets = groupSets(files);
      const probe = sets[0]?.files[0]?.path;
      const access = repo.gated && probe ? await this.hub.canDownload(id, rev, probe) : { ok: true, reason: null };
      const nodes = await this.fleet.online();
      const build = await this.fleet.llamaCppBuild(this.config.llamaCppBuild ?? newestBuild, nodes);
      const freeBytes = await this.mirror.freeBytes();
      const judged = await mapLimit(sets, 4, (s) =>
        this.judge(id, rev, s, access.ok, build, nodes, freeBytes, context ?? null),
      );
      const url = `${this.config.hubUrl}/${id}`;
      return ok({
        id: repo.id,
        revision: rev,
        shortRevision: rev.slice(0, 7),
        gated: repo.gated,
        noAccess: access.ok ? null : access.reason,
        architecture: repo.architecture,
        url,
        cardHtml: readme ? renderCard(readme, url, rev) : null,
        sets: judged,
        context: context ?? null,
      });
    } catch (err) {
      if (err instanceof HubError && err.status === 404)
        return fail(new NotFoundError(`the registry has no repository ${id}`));
      return fail(
        new UpstreamError(err instanceof HubError ? err.message : `the registry failed: ${(err as Error).message}`),
      );
    }
  }

  private async judge(
    id: string,
    rev: string,
    set: FileSet,
    canDownload: boolean,
    build: { build: number; source: string },
    nodes: Awaited<ReturnType<FleetService['online']>>,
    freeBytes: number,
    context: number | null,
  ): Promise<JudgedSet> {
    const base = { ...set, model: suggestedModelName(id), version: rev.slice(0, 7) };
    const disk = { fits: set.totalBytes <= freeBytes, freeBytes, neededBytes: set.totalBytes };
    // A set judged without its header (not llama.cpp's, not a model, incomplete, out of reach): the reason says why.
    const unjudged = (
      reason: string,
      summary: string,
      headerError: string | null = null,
      headerBytesRead = 0,
    ): JudgedSet => ({
      ...base,
      facts: null,
      headerError,
      headerBytesRead,
      verdict: { servable: false, reason, neededBuild: null },
      memory: null,
      fits: { disk, nodes: [], summary },
    });
    if (set.format === 'SAFETENSORS') {
      return unjudged(
        'safetensors weights are served by vLLM, not llama.cpp; the nodes report no vLLM to judge against',
        'no llama.cpp estimate for safetensors',
      );
    }
    if (set.kind === 'IMATRIX')
      return unjudged('an importance matrix: input to quantisation, not a model', 'not a model');
    if (!set.complete) {
      return unjudged(`only ${set.files.length} of its ${set.shardCount} shards are in the repository`, 'incomplete');
    }
    if (!canDownload) return unjudged('gated: the header cannot be read without access', 'no access');
    // The first shard carries the metadata; the others only their tensors.
    const first = set.files[0];
    const src = httpSource(
      this.hub.resolveUrl(id, rev, first?.path ?? ''),
      this.hub.authHeaders(),
      this.config.hubTimeoutMs,
      this.hubFetch,
    );
    let facts: ModelFacts | null = null;
    let headerError: string | null = null;
    try {
      facts = factsOf(await this.cached(`gguf:${id}:${rev}:${first?.path}`, () => readGguf(src, knownTensorTypes)));
    } catch (err) {
      headerError =
        err instanceof GgufError || err instanceof SourceError
          ? err.message
          : `reading the header failed: ${(err as Error).message}`;
    }
    if (!facts) return unjudged(`the header could not be read: ${headerError}`, 'unknown', headerError, src.bytesRead);
    let verdict = verdictFor(facts.architecture, build.build, build.source);
    if (set.kind === 'MMPROJ' && verdict.servable)
      verdict = {
        servable: false,
        reason: 'a vision projector (mmproj): loaded beside a model with --mmproj, never as a model',
        neededBuild: null,
      };
    if (facts.type === 'adapter')
      verdict = {
        servable: false,
        reason: 'a LoRA adapter: loaded on top of its base model, not as one',
        neededBuild: null,
      };
    const ctx = Math.min(context ?? facts.contextLength ?? 4096, context ?? this.config.maxContext);
    const memory = estimateMemory(facts, set.totalBytes, ctx);
    const neededMiB = Math.ceil(memory.totalBytes / 2 ** 20);
    const nodeFits: NodeFit[] = nodes.map((n) => {
      const gpus = Array.isArray(n.gpus) ? n.gpus : [];
      const free = freeMiB(n);
      const fits = free >= neededMiB;
      const reason =
        gpus.length === 0
          ? `${n.name} reports no GPU`
          : fits
            ? `${free} MiB free of GPU memory`
            : `needs ${neededMiB} MiB, ${free} MiB free`;
      return { node: n.name, fits, freeMiB: free, neededMiB, reason };
    });
    const fitting = nodeFits.filter((f) => f.fits).length;
    const summary = !nodes.length
      ? 'no node is online to place it on'
      : fitting
        ? `fits on ${fitting} of ${nodes.length} online node${nodes.length === 1 ? '' : 's'}`
        : `fits on no node: needs ${neededMiB} MiB, the most free is ${Math.max(...nodeFits.map((f) => f.freeMiB))} MiB`;
    return {
      ...base,
      facts,
      headerError,
      headerBytesRead: src.bytesRead,
      verdict,
      memory,
      fits: { disk, nodes: nodeFits, summary },
    };
  }

  /** Fetches one set through the mirror with the registry's sha256 for every file; a set that cannot be served is refused unless forced. */
  async fetchSet(
    ctx: Context,
    input: {
      repo: string;
      revision?: string | null;
      set: string;
      model?: string | null;
      version?: string | null;
      force?: boolean | null;
    },
  ): Promise<Result<FetchStarted>> {
    const parsed = parseInput(
      z.object({
        repo: repoId,
        revision,
        set: z.string().min(1, 'the set id, as registryRepo lists it'),
        model: modelName.nullish(),
        version: versionName.nullish(),
        force: z.boolean().nullish(),
      }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const { repo: id, set: setId, force } = parsed.value;
    const opened = await this.repo({ id, revision: parsed.value.revision });
    if (!opened.ok) return opened;
    const repo = opened.value;
    const set = repo.sets.find((s) => s.id === setId);
    if (!set) {
      return fail(
        new ValidationError(
          'set',
          `set: ${id} has no set ${setId}; it has ${repo.sets.map((s) => s.id).join(', ') || 'no weights'}`,
        ),
      );
    }
    if (repo.noAccess) return fail(new ForbiddenError(`not fetched: ${repo.noAccess}`));
    if (!set.verdict.servable && !force) {
      return fail(new ConflictError(`not fetched: ${set.verdict.reason}. Fetch it anyway with force: true`));
    }
    return this.mirror.fetch(ctx, {
      model: parsed.value.model ?? set.model,
      version: parsed.value.version ?? set.version,
      sources: set.files.map((f) => ({
        url: this.hub.resolveUrl(id, repo.revision, f.path),
        file: f.path.split('/').at(-1),
        sha256: f.sha256,
        size: f.size,
      })),
      force: false,
    });
  }
}

async function mapLimit<T, R>(items: T[], limit: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i] as T);
      }
    }),
  );
  return out;
}
