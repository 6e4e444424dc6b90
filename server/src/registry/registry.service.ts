import { newestBuild } from '@hangar/common/gguf/catalog';
import type { ModelFacts } from '@hangar/common/gguf/facts';
import { estimateMemory } from '@hangar/common/gguf/memory';
import { GgufError } from '@hangar/common/gguf/reader';
import { SourceError } from '@hangar/common/gguf/source';
import { estimateVllmMemory, type HfConfig, vllmVerdict } from '@hangar/common/vllm/verdict';
import { z } from 'zod';
import type { Actor } from '../auth/actor.js';
import type { Config } from '../config.js';
import type { FleetService } from '../fleet/fleet.service.js';
import { freeMiB, largestFreeMiB, nodeGpus, noGpuReason, runsEngine } from '../fleet/node-inventory.js';
import { isCommit } from '../hf/hf.service.js';
import { recordHubRef } from '../hf/hub-refs.js';
import {
  ConflictError,
  ForbiddenError,
  fail,
  NotFoundError,
  ok,
  RegistryOffError,
  type Result,
  UpstreamError,
  ValidationError,
} from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import type { FetchStarted, MirrorService, SourceCheck } from '../mirror/mirror.service.js';
import { modelName, versionName } from '../mirror/paths.js';
import { AnswerCache } from './answer-cache.js';
import { renderCard } from './card.js';
import { Hub, HubError, type HubModel } from './hub.js';
import { headerKind, servingVerdict } from './look.js';
import {
  type FileSet,
  groupSets,
  type RepoFile,
  suggestedModelName,
  suggestedVersions,
  vllmSideFiles,
} from './sets.js';
import { mapLimit, type SourceLook } from './source-look.js';
import type { JudgedSet, NodeFit, RegistryRepo } from './types.js';

// The answer types live in types.ts; re-exported so importers keep this path.
export type { JudgedSet, NodeFit, RegistryRepo } from './types.js';

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

/** What a caller of a registry query hears on a site that turned it off: why, and where it can be turned on. */
export const REGISTRY_OFF =
  'the registry is turned off here (HANGAR_HUB_URL=off): fetch files by URL into the mirror instead, or set HANGAR_HUB_URL to a registry the server can reach';

export type RegistryDeps = {
  config: Config;
  fleet: FleetService;
  /** Where a set is fetched to, and how much room it has. */
  mirror: Pick<MirrorService, 'fetch' | 'freeBytes'>;
  /** The header reads, shared with the look before a fetch by URL (source-look.ts). */
  look: SourceLook;
};

export class RegistryService {
  /** Null when HANGAR_HUB_URL=off: every registry query then answers RegistryOffError, and nothing is sent. */
  private readonly hub: Hub | null;
  /** Answers are kept briefly: an operator paging back and forth should not wait on the registry each time. */
  private readonly cache = new AnswerCache();

  constructor(private readonly deps: RegistryDeps) {
    const { config } = deps;
    // Through the look's fetch: the Hub's redirects (to its CDN) are followed only into networks HANGAR_FETCH_ALLOW
    // admits.
    this.hub = config.hubUrl
      ? new Hub({
          hubUrl: config.hubUrl,
          token: config.hubToken,
          timeoutMs: config.hubTimeoutMs,
          fetch: deps.look.fetch,
        })
      : null;
  }

  /** Whether the explorer is on, and where it looks: what the console asks before it shows a search box. */
  get settings() {
    return { enabled: this.hub !== null, siteUrl: this.deps.config.hubUrl };
  }

  /** The look before a fetch by URL (SourceLook.lookAtSources), through the explorer's header reads. */
  lookAtSources(files: { url: string; file: string }[]): Promise<SourceCheck[]> {
    return this.deps.look.lookAtSources(files);
  }

  /**
   * A repository's files at a revision (resolved to its commit), for training's base weights. `status` is the
   * registry's HTTP status when it answered no (404: no such repository), absent when it could not be reached.
   */
  async listFiles(
    id: string,
    revision: string | null,
  ): Promise<{ ok: true; revision: string; files: RepoFile[] } | { ok: false; status?: number; reason: string }> {
    const hub = this.hub;
    if (!hub) return { ok: false, reason: REGISTRY_OFF };
    try {
      const repo = await this.cache.get(`repo:${id}:${revision ?? ''}`, () => hub.repo(id, revision ?? undefined));
      const files = await this.cache.get(`tree:${id}:${repo.sha}`, () => hub.files(id, repo.sha));
      return { ok: true, revision: repo.sha, files };
    } catch (err) {
      if (err instanceof HubError) return { ok: false, status: err.status, reason: err.message };
      return { ok: false, reason: (err as Error).message };
    }
  }

  /** Where a listed file downloads from; only called with what listFiles answered, so the registry is on. */
  fileUrl(id: string, revision: string, path: string) {
    if (!this.hub) throw new Error(REGISTRY_OFF);
    return this.hub.resolveUrl(id, revision, path);
  }

  async search(input: {
    query?: string | null;
    sort?: string | null;
    first?: number | null;
    after?: string | null;
  }): Promise<Result<{ models: HubModel[]; hasNextPage: boolean; endCursor: string | null }>> {
    const hub = this.hub;
    if (!hub) return fail(new RegistryOffError(REGISTRY_OFF));
    const first = Math.min(Math.max(input.first ?? 20, 1), 100);
    const offset = input.after && /^\d+$/.test(input.after) ? Number(input.after) : 0;
    if (offset > 1000)
      return fail(new ValidationError('after', 'after: paging stops at 1000 results; narrow the search'));
    const sort = (['downloads', 'likes', 'lastModified'] as const).find((s) => s === input.sort) ?? 'downloads';
    const query = (input.query ?? '').trim().slice(0, 200);
    try {
      const all = await this.cache.get(`search:${query}:${sort}:${offset + first + 1}`, () =>
        hub.search(query, sort, offset + first + 1),
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
    const hub = this.hub;
    if (!hub) return fail(new RegistryOffError(REGISTRY_OFF));
    const parsed = parseInput(
      z.object({ id: repoId, revision, context: z.number().int().min(256).max(4_194_304).nullish() }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const { id, context } = parsed.value;
    try {
      const repo = await this.cache.get(`repo:${id}:${parsed.value.revision ?? ''}`, () =>
        hub.repo(id, parsed.value.revision ?? undefined),
      );
      const rev = repo.sha;
      const [files, readme] = await this.cache.get(`files:${id}:${rev}`, () =>
        Promise.all([hub.files(id, rev), hub.readme(id, rev)]),
      );
      const sets = groupSets(files);
      const probe = sets[0]?.files[0]?.path;
      const access = repo.gated && probe ? await hub.canDownload(id, rev, probe) : { ok: true, reason: null };
      const nodes = await this.deps.fleet.online();
      const build = await this.deps.fleet.llamaCppBuild(this.deps.config.llamaCppBuild ?? newestBuild, nodes);
      const freeBytes = await this.deps.mirror.freeBytes();
      // config.json is read only where a vLLM node could serve a safetensors set: it is what vLLM judges by.
      const vllmNodes = nodes.filter((n) => runsEngine(n, 'vllm'));
      const hfConfig =
        vllmNodes.length && sets.some((s) => s.format === 'SAFETENSORS') && access.ok
          ? await this.cache.get(`config:${id}:${rev}`, () => hub.config(id, rev))
          : null;
      const judged = await mapLimit(sets, 4, (s) =>
        s.format === 'SAFETENSORS'
          ? Promise.resolve(
              this.judgeForVllm(s, id, rev, { access: access.ok, nodes: vllmNodes, freeBytes, context, hfConfig }),
            )
          : this.judge(hub, id, rev, s, access.ok, build, nodes, freeBytes, context ?? null),
      );
      // What the headers say a set is can differ from what its name suggested: the order follows the headers.
      const rank: Record<JudgedSet['kind'], number> = { MODEL: 0, ADAPTER: 1, MMPROJ: 2, IMATRIX: 3 };
      judged.sort((a, b) => rank[a.kind] - rank[b.kind] || a.totalBytes - b.totalBytes || a.id.localeCompare(b.id));
      // One version per set: a repository's sets share a revision, and one default for all would land a 161 KiB
      // model and a 5 GiB one in the same version.
      const versions = suggestedVersions(rev, judged);
      for (const [i, s] of judged.entries()) s.version = versions[i] ?? s.version;
      const url = `${hub.siteUrl}/${id}`;
      return ok({
        id: repo.id,
        revision: rev,
        shortRevision: rev.slice(0, 7),
        gated: repo.gated,
        noAccess: access.ok ? null : access.reason,
        architecture: repo.architecture,
        url,
        cardHtml: readme ? await renderCard(readme, url, rev) : null,
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

  /**
   * A safetensors set, judged as vLLM would take it: the architecture config.json names against vLLM's model
   * registry, the memory its weights and one context of KV cache need, and which vLLM node has a card with that
   * free (vLLM runs a replica on one card here: no tensor parallelism yet).
   */
  private judgeForVllm(
    set: FileSet,
    id: string,
    rev: string,
    o: {
      access: boolean;
      nodes: Awaited<ReturnType<FleetService['online']>>;
      freeBytes: number;
      context: number | null | undefined;
      hfConfig: HfConfig | null;
    },
  ): JudgedSet {
    const base = { ...set, model: suggestedModelName(id), version: rev.slice(0, 7) };
    const disk = { fits: set.totalBytes <= o.freeBytes, freeBytes: o.freeBytes, neededBytes: set.totalBytes };
    const none = (reason: string, summary: string): JudgedSet => ({
      ...base,
      facts: null,
      headerError: null,
      headerBytesRead: 0,
      verdict: { servable: false, reason, neededBuild: null },
      memory: null,
      fits: { disk, nodes: [], summary },
    });
    if (!o.nodes.length)
      return none(
        'safetensors weights are served by vLLM, and no online node reports vLLM (install vllm on a node, or set HANGAR_AGENT_VLLM_COMMAND)',
        'no vLLM node online',
      );
    if (!set.complete)
      return none(`only ${set.files.length} of its ${set.shardCount} shards are in the repository`, 'incomplete');
    if (!o.access) return none('gated: config.json cannot be read without access', 'no access');
    const verdict = vllmVerdict(o.hfConfig);
    if (!verdict.servable || !o.hfConfig) return { ...none(verdict.reason, 'not servable by vLLM'), verdict };
    const memory = estimateVllmMemory(o.hfConfig, set.totalBytes, o.context ?? this.deps.config.maxContext);
    const neededMiB = Math.ceil(memory.totalBytes / 2 ** 20);
    const nodeFits: NodeFit[] = o.nodes.map((n) => {
      const free = largestFreeMiB(n);
      const fits = free >= neededMiB;
      const reason =
        nodeGpus(n).length === 0
          ? `${n.name} reports no GPU (vLLM needs one)`
          : fits
            ? `${free} MiB free on one card`
            : `needs ${neededMiB} MiB on one card, ${free} MiB free`;
      return { node: n.name, fits, freeMiB: free, neededMiB, reason };
    });
    const fitting = nodeFits.filter((f) => f.fits).length;
    const summary = fitting
      ? `fits on ${fitting} of ${o.nodes.length} vLLM node${o.nodes.length === 1 ? '' : 's'}`
      : `fits on no vLLM node: needs ${neededMiB} MiB on one card, the most free is ${Math.max(...nodeFits.map((f) => f.freeMiB))} MiB`;
    return {
      ...base,
      facts: null,
      headerError: null,
      headerBytesRead: 0,
      verdict,
      memory,
      fits: { disk, nodes: nodeFits, summary },
    };
  }

  private async judge(
    hub: Hub,
    id: string,
    rev: string,
    set: FileSet,
    canDownload: boolean,
    build: { build: number; source: string },
    nodes: Awaited<ReturnType<FleetService['online']>>,
    freeBytes: number,
    context: number | null,
  ): Promise<JudgedSet> {
    // The version is settled once every set is judged (suggestedVersions): it depends on the others.
    const base = { ...set, model: suggestedModelName(id), version: rev.slice(0, 7) };
    const disk = { fits: set.totalBytes <= freeBytes, freeBytes, neededBytes: set.totalBytes };
    // A set judged without its header (not llama.cpp's, incomplete, out of reach): the reason says why.
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
    if (!set.complete) {
      return unjudged(`only ${set.files.length} of its ${set.shardCount} shards are in the repository`, 'incomplete');
    }
    if (!canDownload) return unjudged('gated: the header cannot be read without access', 'no access');
    // The first shard carries the metadata; the others only their tensors. Every set's header is read, whatever
    // its name says: "imatrix" in a name is as often "quantised with one" as "is one".
    const first = set.files[0];
    const url = hub.resolveUrl(id, rev, first?.path ?? '');
    let facts: ModelFacts | null = null;
    let headerError: string | null = null;
    let headerBytesRead = 0;
    try {
      const read = await this.deps.look.read(url, hub.authHeaders());
      facts = read.facts;
      headerBytesRead = read.bytesRead;
    } catch (err) {
      headerBytesRead = (err as { bytesRead?: number }).bytesRead ?? 0;
      headerError =
        err instanceof GgufError || err instanceof SourceError
          ? err.message
          : `reading the header failed: ${(err as Error).message}`;
    }
    if (!facts)
      return unjudged(`the header could not be read: ${headerError}`, 'unknown', headerError, headerBytesRead);
    const kind = headerKind(facts);
    const verdict = servingVerdict(facts, kind, build);
    if (kind !== 'MODEL') {
      return {
        ...base,
        kind,
        facts,
        headerError,
        headerBytesRead,
        verdict,
        memory: null,
        fits: { disk, nodes: [], summary: 'not a model' },
      };
    }
    const ctx = Math.min(context ?? facts.contextLength ?? 4096, context ?? this.deps.config.maxContext);
    const memory = estimateMemory(facts, set.totalBytes, ctx);
    const neededMiB = Math.ceil(memory.totalBytes / 2 ** 20);
    const nodeFits: NodeFit[] = nodes.map((n) => {
      const gpus = nodeGpus(n);
      const free = freeMiB(n);
      const fits = free >= neededMiB;
      const reason =
        gpus.length === 0
          ? noGpuReason(n.name, neededMiB)
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
      kind,
      facts,
      headerError,
      headerBytesRead,
      verdict,
      memory,
      fits: { disk, nodes: nodeFits, summary },
    };
  }

  /** Fetches one set through the mirror with the registry's sha256 for every file; a set that cannot be served is refused unless forced. */
  async fetchSet(
    actor: Actor,
    input: {
      repo: string;
      revision?: string | null;
      set: string;
      model?: string | null;
      version?: string | null;
      force?: boolean | null;
      /**
       * The branch or tag the caller resolved `revision` (a commit) from with `repo` just before (a serve job
       * does, to judge the set first; HEAD for the default branch): recorded as what the Hub named for it.
       */
      ref?: string | null;
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
        ref: revision,
      }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const hub = this.hub;
    if (!hub) return fail(new RegistryOffError(REGISTRY_OFF));
    const { repo: id, set: setId, force } = parsed.value;
    // A fetch is a decision to download: a branch is resolved now, not from the explorer's answer of a minute ago,
    // and the commit it resolves to is recorded as what the Hub names for it (/hf answers main with it).
    if (!parsed.value.revision || !isCommit(parsed.value.revision))
      this.cache.forget(`repo:${id}:${parsed.value.revision ?? ''}`);
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
    const side =
      set.format === 'SAFETENSORS'
        ? vllmSideFiles(
            await this.cache.get(`sidefiles:${id}:${repo.revision}`, () => hub.files(id, repo.revision)),
            set,
          )
        : [];
    return this.deps.mirror.fetch(
      actor,
      {
        model: parsed.value.model ?? set.model,
        version: parsed.value.version ?? set.version,
        sources: [...set.files, ...side].map((f) => ({
          url: hub.resolveUrl(id, repo.revision, f.path),
          file: f.path.split('/').at(-1),
          sha256: f.sha256,
          size: f.size,
        })),
        force: false,
        // Forced past the verdict here already: the mirror's own look would only refuse it again.
        fetchAnyway: Boolean(force),
      },
      {
        action: 'fetchRepoSet',
        withRows: (tx) =>
          recordHubRef(tx, { repo: id, revision: parsed.value.ref ?? parsed.value.revision, commit: repo.revision }),
      },
    );
  }
}
