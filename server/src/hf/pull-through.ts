import { createHash } from 'node:crypto';
import type { Logger } from '@hangar/common/log';
import { guardedFetch } from '@hangar/common/outbound';
import { sleep } from '@hangar/common/retry';
import { actorOf } from '../auth/actor.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Db } from '../db/client.js';
import { fail, NotFoundError, ok, type Result, UpstreamError } from '../lib/errors.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { hubLibrary } from '../registry/hub-library.js';
import {
  EntryNotMirroredError,
  type HfFile,
  type HfSnapshot,
  RepoNotMirroredError,
  RevisionNotMirroredError,
} from './hf.service.js';
import { recordHubRef } from './hub-refs.js';

// The pull-through cache behind /hf (HANGAR_HF_PULL_THROUGH=on), as Olah keeps one: what the mirror lacks is
// looked up on the Hub (HANGAR_HUB_URL), downloaded by the mirror's own queue into a version named after the
// repository and commit (so it is resumed, verified against the Hub's sha256, deduplicated and audited like any
// fetchToMirror), and served once it is PRESENT. The client waits for the verified file rather than being
// streamed the bytes as they arrive: a stream would hand out bytes before their sha256 is known, and every file
// the mirror serves is one it verified. The cost is that the first client of a large file waits for the whole
// download before its first byte (see README: huggingface_hub's timeouts).
//
// Who may trigger one: operators and admins (a session or an API token), nodes, and the server itself. Each is
// disk and egress spent at the caller's word, so a viewer's token (which may read the mirror) cannot fill it;
// for a viewer /hf answers as it does with pull-through off.

/** A file as the Hub lists it at a commit. */
export type UpstreamFile = {
  path: string;
  size: number;
  /** The Hub's sha256 for a Git LFS file; null for a file kept in Git itself (the Hub publishes no sha256 then). */
  sha256: string | null;
  /** The Hub's Git blob id: the file's oid in tree listings. */
  oid: string;
};

export type UpstreamRepo = { id: string; commit: string; files: UpstreamFile[] };
type PullAt = Pick<UpstreamRepo, 'id' | 'commit'>;
type PullFile = Pick<UpstreamFile, 'path' | 'size' | 'sha256'>;

/** Whether this caller may make the mirror download from the Hub. */
export function mayPullThrough(viewer: Viewer): boolean {
  if (viewer.kind === 'node' || viewer.kind === 'system') return true;
  if (viewer.kind === 'token' && viewer.callerOnly) return false;
  return (viewer.kind === 'user' || viewer.kind === 'token') && roleAtLeast(viewer.role, 'OPERATOR');
}

/**
 * The mirror's name for a Hub repository: `owner--name`, lowercased (the Hub's ids are case-insensitive, and it
 * refuses '--' in a name, so two repositories never meet in one name). Past the 100 characters a model name may
 * have, cut and told apart by a hash.
 */
export function pulledModelName(repo: string): string {
  const name = repo.toLowerCase().replace('/', '--');
  if (name.length <= 100) return name;
  return `${name.slice(0, 87)}-${createHash('sha256').update(name).digest('hex').slice(0, 12)}`;
}

const COMMIT = /^[0-9a-f]{40}$/;
/** How long a branch's commit is believed without asking again; a commit's listing never changes. */
const BRANCH_TTL_MS = 30_000;
const LISTINGS_KEPT = 256;
const FILES_LISTED = 20_000;

export class PullThrough {
  private readonly fetch: typeof fetch;
  /** Listings by `repo@revision` (lowercased repo): in flight or done, so concurrent misses ask the Hub once. */
  private readonly listings = new Map<string, { at: number; value: Promise<Result<UpstreamRepo>>; failed?: boolean }>();
  /** Downloads this process is waiting on, by mirror file: concurrent requests for one file share one. */
  private readonly pulls = new Map<string, Promise<Result<void>>>();

  constructor(
    private readonly o: {
      db: Db;
      mirror: MirrorService;
      hubUrl: string;
      hubToken?: string;
      timeoutMs: number;
      log: Logger;
      /** How often a waiting request looks at the file's row. */
      pollMs?: number;
    },
  ) {
    // Every hop checked against HANGAR_FETCH_ALLOW, as the registry's calls are.
    const guarded = guardedFetch(o.mirror.outbound);
    this.fetch = (input, init) =>
      guarded(input, {
        ...init,
        signal: AbortSignal.any([AbortSignal.timeout(o.timeoutMs), ...(init?.signal ? [init.signal] : [])]),
      });
  }

  /**
   * The repository at a revision as the Hub has it: a branch or tag resolved to its commit as the Hub does
   * (`/api/models/{repo}/revision/{rev}`), and every file at that commit with its size and sha256.
   */
  upstream(repo: string, revision: string): Promise<Result<UpstreamRepo>> {
    const key = `${repo.toLowerCase()}@${revision}`;
    const known = this.listings.get(key);
    // A commit's listing is kept; a branch's, or a failure, for a while: long enough that a Hub out of reach
    // costs one timeout per repository and not one per request, short enough to see a branch move.
    const fresh = known && Date.now() - known.at < BRANCH_TTL_MS;
    if (known && (fresh || (COMMIT.test(revision) && !known.failed))) return known.value;
    const value = this.list(repo, revision);
    const entry: { at: number; value: Promise<Result<UpstreamRepo>>; failed?: boolean } = { at: Date.now(), value };
    this.listings.delete(key);
    this.listings.set(key, entry);
    void value.then((r) => {
      entry.failed = !r.ok;
    });
    while (this.listings.size > LISTINGS_KEPT) {
      const oldest = this.listings.keys().next().value;
      if (oldest === undefined) break;
      this.listings.delete(oldest);
    }
    return value;
  }

  private async list(repo: string, revision: string): Promise<Result<UpstreamRepo>> {
    const common = {
      hubUrl: this.o.hubUrl,
      fetch: this.fetch,
      ...(this.o.hubToken ? { accessToken: this.o.hubToken } : {}),
    };
    const hub = await hubLibrary();
    try {
      const info = await hub.modelInfo({ ...common, name: repo, revision, additionalFields: ['sha'] });
      const commit = (info as { sha?: string }).sha;
      if (!commit || !COMMIT.test(commit))
        return fail(new UpstreamError(`the Hub at ${this.o.hubUrl} named no commit for ${repo} at ${revision}`));
      // A commit asked for is that commit or nothing: files of another one must not be kept under its name.
      if (COMMIT.test(revision) && commit !== revision)
        return fail(
          new RevisionNotMirroredError(
            `${repo} is not in Hangar's mirror at ${revision}, and the Hub at ${this.o.hubUrl} answered that revision with another commit (${commit})`,
          ),
        );
      const files: UpstreamFile[] = [];
      for await (const f of hub.listFiles({
        ...common,
        repo: { type: 'model', name: repo },
        revision: commit,
        recursive: true,
      })) {
        if (f.type !== 'file') continue;
        files.push({ path: f.path, size: f.lfs?.size ?? f.size, sha256: f.lfs?.oid ?? null, oid: f.oid ?? '' });
        if (files.length > FILES_LISTED)
          return fail(
            new UpstreamError(`${repo} has more than ${FILES_LISTED} files: too many to serve through the mirror`),
          );
      }
      // What the Hub names for a branch now, kept for the callers who do not ask it (viewers, pull-through off).
      await recordHubRef(this.o.db, { repo, revision, commit }).catch((err) =>
        this.o.log.warn('pull-through: could not record the commit the Hub named', { repo, revision, error: err }),
      );
      return ok({ id: info.name || repo, commit, files });
    } catch (err) {
      const status = err instanceof hub.HubApiError ? err.statusCode : undefined;
      if (status === 404) {
        // The Hub's own answer, in the words /hf uses for a miss: a client fails as it would on the Hub.
        const message = `${repo} is not in Hangar's mirror, and the Hub at ${this.o.hubUrl} has no ${COMMIT.test(revision) ? `commit ${revision} of it` : `${repo} at ${revision}`}`;
        return fail(COMMIT.test(revision) ? new RevisionNotMirroredError(message) : new RepoNotMirroredError(message));
      }
      if (status === 401 || status === 403)
        return fail(
          new UpstreamError(
            `the Hub at ${this.o.hubUrl} refused ${repo}: a private or gated repository needs HANGAR_HUB_TOKEN with access to it`,
          ),
        );
      const e = err as Error;
      const why = e.name === 'TimeoutError' ? `no answer in ${this.o.timeoutMs} ms (HANGAR_HUB_TIMEOUT_MS)` : e.message;
      return fail(new UpstreamError(`the Hub at ${this.o.hubUrl} could not list ${repo} at ${revision}: ${why}`));
    }
  }

  /**
   * Makes the mirror hold one file of the repository at the commit, and waits until it is PRESENT (verified) or
   * its download failed. Concurrent calls for one file share one download.
   */
  pull(viewer: Viewer, repo: PullAt, file: PullFile, signal?: AbortSignal): Promise<Result<void>> {
    const model = pulledModelName(repo.id);
    const version = repo.commit;
    const key = `${model}/${version}/${file.path}`;
    let shared = this.pulls.get(key);
    if (!shared) {
      shared = this.download(viewer, repo, file, model, version).finally(() => this.pulls.delete(key));
      this.pulls.set(key, shared);
    }
    if (!signal) return shared;
    // A client that goes away stops waiting; the download goes on, for the next one.
    return Promise.race([
      shared,
      new Promise<Result<void>>((resolve) => {
        const gone = () => resolve(fail(new UpstreamError('the client went away')));
        if (signal.aborted) gone();
        else signal.addEventListener('abort', gone, { once: true });
      }),
    ]);
  }

  private async download(
    viewer: Viewer,
    repo: PullAt,
    file: PullFile,
    model: string,
    version: string,
  ): Promise<Result<void>> {
    const what = `${file.path} of ${repo.id} at ${repo.commit}`;
    const url = `${this.o.hubUrl}/${repo.id}/resolve/${repo.commit}/${file.path.split('/').map(encodeURIComponent).join('/')}`;
    // Audited as a fetchToMirror by whoever asked, as if they had asked for it in the console.
    const actor = actorOf(viewer, { requestId: `hf-pull-${Date.now().toString(36)}` });
    let raced: Error | null = null;
    const started = await this.o.mirror
      .fetch(actor, {
        model,
        version,
        sources: [{ url, file: file.path, size: file.size, ...(file.sha256 ? { sha256: file.sha256 } : {}) }],
        // The client asked for this file by name: whether the nodes' llama.cpp loads it is not the question.
        fetchAnyway: true,
      })
      .catch((err: Error) => {
        // Another replica created the row a moment earlier: its download is the one to wait for.
        this.o.log.debug('pull-through fetch raced another', { file: what, error: err });
        raced = err;
        return null;
      });
    if (started && !started.ok)
      // The mirror's own refusal: a name it cannot keep (it says which characters it takes), or a full disk.
      return fail(new UpstreamError(`${what} cannot be kept in Hangar's mirror: ${started.error.message}`));
    const pollMs = this.o.pollMs ?? 100;
    for (;;) {
      const row = await this.o.db.mirrorFile.findUnique({
        where: { model_version_file: { model, version, file: file.path } },
        select: { state: true, actualSha256: true, error: true, retryReason: true, retryAt: true },
      });
      if (!row)
        return fail(
          new UpstreamError(
            raced
              ? `${what} could not be queued in Hangar's mirror: ${(raced as Error).message}`
              : `${what} was removed from the mirror while it was being fetched`,
          ),
        );
      if (row.state === 'PRESENT' && row.actualSha256) return ok(undefined);
      if (row.state === 'FAILED')
        return fail(new UpstreamError(`fetching ${what} from the Hub failed: ${row.error ?? 'no reason recorded'}`));
      if (row.state === 'CANCELLED' || row.state === 'PAUSED')
        return fail(
          new UpstreamError(
            `fetching ${what} was ${row.state.toLowerCase()} in the mirror; resume it there, or ask again`,
          ),
        );
      // The mirror keeps trying an upstream that is away, for hours if need be; the client hears why now.
      if (row.retryAt)
        return fail(
          new UpstreamError(
            `fetching ${what} from the Hub stalled: ${row.retryReason ?? 'the Hub did not answer'}; the mirror tries again at ${row.retryAt.toISOString()}, ask again then`,
          ),
        );
      await sleep(pollMs);
    }
  }
}

/** Whether a lookup in the mirror failed only because it lacks the repository, revision or file. */
export function isMiss(error: { code: string }): boolean {
  return (
    error instanceof RepoNotMirroredError ||
    error instanceof RevisionNotMirroredError ||
    error instanceof EntryNotMirroredError ||
    (error instanceof NotFoundError && 'hubCode' in error)
  );
}

/**
 * The repository at the Hub's commit, as /hf lists it with pull-through on: every file the Hub has there (a
 * client lists, then asks for each), with the mirror's own record where it holds the file already.
 */
export function withUpstream(local: HfSnapshot | null, up: UpstreamRepo): HfSnapshot {
  const held = new Map(local && local.commit === up.commit ? local.files.map((f) => [f.path, f] as const) : []);
  const files: HfFile[] = up.files
    .map(
      (f): HfFile =>
        held.get(f.path) ?? {
          path: f.path,
          size: f.size,
          sha256: f.sha256,
          stored: null,
          finishedAt: null,
          oid: f.oid,
        },
    )
    .sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  const same = local?.commit === up.commit ? local : null;
  return {
    id: up.id,
    commit: up.commit,
    files,
    lastModified: same?.lastModified ?? null,
    createdAt: same?.createdAt ?? null,
  };
}
