import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import type { AuthService } from '../auth/auth.service.js';
import { sendJson } from '../http/reply.js';
import type { Edge } from '../http/routes.js';
import type { HangarError } from '../lib/errors.js';
import type { MirrorPaths } from '../mirror/paths.js';
import { mirrorCaller, mirrorCredentials, sendStoredFile } from '../mirror/serve.js';
import { sendStoreBlob } from '../mirror/store/send-blob.js';
import type { MirrorStore } from '../mirror/store/store.js';
import { ggufManifest, type HfFile, type HfMirror, type HfSnapshot, isCommit, lfsPointer } from './hf.service.js';
import { isMiss, mayPullThrough, type PullThrough, withUpstream } from './pull-through.js';

// The mirror over the Hugging Face Hub's protocol, under /hf, so that `HF_ENDPOINT=http://hangar:4000/hf`
// (huggingface_hub, transformers, vLLM, TGI) and `hubUrl`/`env.remoteHost` (the JS clients) download from it
// with no other change; llama.cpp's `-hf` too (MODEL_ENDPOINT). Only what the clients read is served (model
// info, the tree listing, resolve and llama.cpp's manifest), with the Hub's headers and its error codes
// (X-Error-Code), so a client that asks for what is not mirrored fails with its usual error
// (RepositoryNotFoundError, EntryNotFoundError) rather than a parse error.
//
// Tokens: the same rules as /mirror. The JS client refuses a token that does not start with `hf_`, so a
// Hangar token is accepted here as `hf_<token>` too (HF_TOKEN=hf_hgr_…): the prefix is taken off before the
// token is looked up, and only on /hf.

type Deps = {
  hf: HfMirror;
  paths: MirrorPaths;
  auth: AuthService;
  requireToken: boolean;
  internalToken: string;
  log: Logger;
  /** HANGAR_HF_PULL_THROUGH=on with a Hub to pull from; null serves only what the mirror holds. */
  pull?: PullThrough | null;
  /** The bucket the files are in (HANGAR_MIRROR_STORE=s3://…), once the storage is open; null on `file`. */
  bucket?: () => MirrorStore | null;
};

/** The Hub's answer to a failed request: its status, X-Error-Code and message, and `{ error }` as JSON. */
function hubError(
  req: IncomingMessage,
  res: ServerResponse,
  status: number,
  message: string,
  o: { code?: string; headerMessage?: string; headers?: Record<string, string> } = {},
) {
  const headers: Record<string, string> = { 'x-error-message': headerSafe(o.headerMessage ?? message), ...o.headers };
  if (o.code) headers['x-error-code'] = o.code;
  hubJson(req, res, status, { error: message }, headers);
}

/** A header carries visible ASCII only (a path may hold any character): the rest is shown as '?'. */
function headerSafe(s: string): string {
  return s.replace(/[^\x20-\x7e]/g, '?').slice(0, 500);
}

function json(req: IncomingMessage, res: ServerResponse, body: unknown, headers: Record<string, string> = {}) {
  hubJson(req, res, 200, body, { 'cache-control': 'no-cache', ...headers });
}

/** The Hub's one JSON writer: its content type names the charset, and HEAD gets the headers alone, as the Hub's. */
function hubJson(
  req: IncomingMessage,
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string>,
) {
  sendJson(res, status, body, {
    headers: { 'content-type': 'application/json; charset=utf-8', ...headers },
    head: req.method === 'HEAD',
  });
}

/**
 * A typed refusal from HfMirror as the Hub words it: 404 with its X-Error-Code, 400 for a bad name, 502 for a
 * pull-through the Hub did not complete (the client's error says why; nothing unverified was kept or sent).
 */
function refusal(req: IncomingMessage, res: ServerResponse, error: HangarError) {
  if (error.code === 'VALIDATION') return hubError(req, res, 400, error.message);
  if (error.code === 'UPSTREAM') return hubError(req, res, 502, error.message);
  const code = (error as { hubCode?: string }).hubCode;
  return hubError(req, res, 404, error.message, { code: code ?? 'RepoNotFound' });
}

/** The Hub's model info (`GET /api/models/{repo}[/revision/{rev}]`), with every sibling's size and sha256. */
export function modelInfo(s: HfSnapshot) {
  const [owner] = s.id.split('/');
  return {
    _id: createHash('md5').update(s.id).digest('hex').slice(0, 24),
    id: s.id,
    modelId: s.id,
    author: s.id.includes('/') ? owner : undefined,
    sha: s.commit,
    lastModified: s.lastModified?.toISOString(),
    createdAt: s.createdAt?.toISOString(),
    private: false,
    disabled: false,
    gated: false,
    downloads: 0,
    likes: 0,
    tags: [],
    siblings: s.files.map(sibling),
    usedStorage: s.files.reduce((n, f) => n + f.size, 0),
  };
}

function sibling(f: HfFile) {
  if (f.sha256 === null) return { rfilename: f.path, size: f.size, blobId: f.oid };
  const lfs = lfsPointer(f.sha256, f.size);
  return {
    rfilename: f.path,
    size: f.size,
    blobId: lfs.oid,
    lfs: { sha256: f.sha256, size: f.size, pointerSize: lfs.pointerSize },
  };
}

/** A URL's path segments after a prefix, each decoded; null when one is not valid percent-encoding. */
function segments(rest: string): string[] | null {
  try {
    return rest.split('/').map((p) => decodeURIComponent(p));
  } catch {
    return null;
  }
}

/** `owner/name/<word>/…` or the legacy one-part `name/<word>/…`: the repository id and what follows it. */
function splitRepo(parts: string[], words: string[]): { repo: string; rest: string[] } {
  if (parts.length >= 2 && words.includes(parts[1] ?? '') && !words.includes(parts[2] ?? ''))
    return { repo: parts[0] ?? '', rest: parts.slice(1) };
  return { repo: parts.slice(0, 2).join('/'), rest: parts.slice(2) };
}

type Route =
  | { kind: 'info'; repo: string; revision: string }
  | { kind: 'tree'; repo: string; revision: string; dir: string }
  | { kind: 'resolve'; repo: string; revision: string; path: string }
  | { kind: 'manifest'; repo: string; tag: string }
  | { kind: 'bad'; why: string }
  | { kind: 'unknown' };

/** Which of the Hub's endpoints a path under /hf is, read before any credential so a wrong URL is a plain 404. */
export function hfRoute(pathname: string): Route {
  const parts = segments(pathname.replace(/^\/hf\/?/, ''));
  if (!parts) return { kind: 'bad', why: 'the path is not valid percent-encoding: each part of a URL is URL-encoded' };
  if (parts.some((p) => p === '..' || p === '.' || p.includes('\0')))
    return { kind: 'bad', why: "a path with '.' or '..' parts (or a NUL) is not a file in a repository" };
  // llama.cpp's `-hf`: GET /v2/<owner>/<repo>/manifests/<tag>, then resolve on main.
  if (parts[0] === 'v2') {
    if (parts.length === 5 && parts[3] === 'manifests' && parts[1] && parts[2] && parts[4])
      return { kind: 'manifest', repo: `${parts[1]}/${parts[2]}`, tag: parts[4] };
    return { kind: 'unknown' };
  }
  if (parts[0] === 'api') {
    if (parts[1] !== 'models' || parts.length < 3 || !parts[2]) return { kind: 'unknown' };
    const { repo, rest } = splitRepo(parts.slice(2), ['revision', 'tree']);
    const [word, revision, ...inside] = rest;
    if (word === undefined) return { kind: 'info', repo, revision: 'main' };
    // `revision/HEAD` (what @huggingface/hub's modelInfo asks) is, like main or any name but a commit, the newest.
    if (word === 'revision' && revision && rest.length === 2) return { kind: 'info', repo, revision };
    if (word === 'tree' && revision) return { kind: 'tree', repo, revision, dir: inside.filter(Boolean).join('/') };
    return { kind: 'unknown' };
  }
  const { repo, rest } = splitRepo(parts, ['resolve']);
  const [word, revision, ...inside] = rest;
  if (word === 'resolve' && revision && inside.length)
    return { kind: 'resolve', repo, revision, path: inside.join('/') };
  return { kind: 'unknown' };
}

/** `Bearer hf_<Hangar token>`: what HF_TOKEN holds when a client insists on the Hub's token shape. */
export function hfAuthorization(req: IncomingMessage): string | null {
  return req.headers.authorization?.replace(/^(Bearer\s+)hf_(hg[a-z]_)/i, '$1$2') ?? null;
}

export function hfRoutes({ hf, paths, auth, requireToken, internalToken, log, pull, bucket }: Deps) {
  return async (req: IncomingMessage, res: ServerResponse, pathname: string, edge?: Pick<Edge, 'viewer' | 'log'>) => {
    // The edge's logger, when there is one: its lines carry the request's id.
    const requestLog = edge?.log ?? log;
    const route = hfRoute(pathname);
    if (route.kind === 'unknown') {
      return sendJson(
        res,
        404,
        {
          error: `nothing is served at ${pathname}: Hangar's Hub protocol serves /hf/api/models/<repo>[/revision/<rev>], /hf/api/models/<repo>/tree/<rev>[/<path>], /hf/<repo>/resolve/<rev>/<path> and /hf/v2/<repo>/manifests/<quant>`,
          code: 'NOT_FOUND',
        },
        { head: req.method === 'HEAD' },
      );
    }
    if (req.method !== 'GET' && req.method !== 'HEAD')
      return hubError(req, res, 405, `${req.method} is not served by Hangar's mirror: it only downloads (GET, HEAD)`, {
        headers: { allow: 'GET, HEAD' },
      });
    if (route.kind === 'bad') return hubError(req, res, 400, route.why);
    const authorization = hfAuthorization(req);
    const caller = await mirrorCaller(
      { requireToken, internalToken },
      authorization,
      edge?.viewer ?? (() => auth.identify(mirrorCredentials(req, authorization))),
    );
    if (!caller.ok) {
      // The Hub's words for a refused token, so huggingface_hub says the token is wrong, not the repository.
      return hubError(req, res, 401, caller.reason, {
        headerMessage: caller.bearer ? 'Invalid credentials in Authorization header' : caller.reason,
        headers: { 'www-authenticate': 'Bearer realm="Hangar mirror"' },
      });
    }
    // Pull-through, for whom it is open: what the mirror lacks is listed from the Hub, and fetched when asked for.
    const puller = pull && mayPullThrough(caller.viewer) ? pull : null;
    /**
     * With pull-through, a branch or tag (main) is asked of the Hub: the commit it names now, not whichever commit
     * the mirror fetched last, which may be any commit of the repository (a pull request's, say). Null for a
     * commit, for callers that may not ask the Hub, and for a name that is not a repository.
     */
    const named = async (repo: string, revision: string) =>
      puller && !isCommit(revision) && hf.validate(repo).ok ? puller.upstream(repo, revision) : null;
    /**
     * The repository at a revision: the mirror's, or with pull-through the Hub's listing at the commit the Hub
     * names for a branch (or the commit asked for), with the mirror's own record of what it holds there. A Hub out
     * of reach leaves the mirror's answer as it is.
     */
    const snapshotFor = async (repo: string, revision: string) => {
      const branch = await named(repo, revision);
      const local = await hf.snapshot(repo, branch?.ok ? branch.value.commit : revision);
      if (!puller || (!local.ok && !isMiss(local.error))) return local;
      const up = branch ?? (await puller.upstream(repo, local.ok ? local.value.commit : revision));
      if (!up.ok) {
        if (!local.ok) return up;
        requestLog.warn('pull-through: the Hub did not list a mirrored repository; serving what the mirror holds', {
          repo,
          error: up.error.message,
        });
        return local;
      }
      return { ok: true as const, value: withUpstream(local.ok ? local.value : null, up.value) };
    };
    if (route.kind === 'info') {
      const snap = await snapshotFor(route.repo, route.revision);
      if (!snap.ok) return refusal(req, res, snap.error);
      return json(req, res, modelInfo(snap.value));
    }
    if (route.kind === 'manifest') {
      const snap = await snapshotFor(route.repo, 'main');
      if (!snap.ok) return refusal(req, res, snap.error);
      const manifest = ggufManifest(snap.value, route.tag);
      if (!manifest.ok) return refusal(req, res, manifest.error);
      return json(req, res, manifest.value);
    }
    if (route.kind === 'tree') {
      const snap = await snapshotFor(route.repo, route.revision);
      if (!snap.ok) return refusal(req, res, snap.error);
      const recursive = ['true', '1'].includes(
        new URL(req.url ?? '/', 'http://hangar').searchParams.get('recursive') ?? '',
      );
      const listed = hf.tree(snap.value, route.dir, recursive);
      if (!listed.ok) return refusal(req, res, listed.error);
      return json(req, res, listed.value);
    }
    const branch = await named(route.repo, route.revision);
    let found = await hf.file(route.repo, branch?.ok ? branch.value.commit : route.revision, route.path);
    if (!found.ok && puller && isMiss(found.error)) {
      const snap = await snapshotFor(route.repo, route.revision);
      if (!snap.ok) return refusal(req, res, snap.error);
      const listed = snap.value.files.find((f) => f.path === route.path);
      if (!listed) return refusal(req, res, found.error);
      if (!listed.stored) {
        const gone = new AbortController();
        res.once('close', () => gone.abort());
        const pulled = await puller.pull(caller.viewer, snap.value, listed, gone.signal);
        if (res.destroyed) return;
        if (!pulled.ok) return refusal(req, res, pulled.error);
      }
      found = await hf.file(route.repo, snap.value.commit, route.path);
    }
    if (!found.ok) return refusal(req, res, found.error);
    const { snapshot, file } = found.value;
    if (!file.stored)
      return hubError(req, res, 404, `${file.path} is not in Hangar's mirror`, { code: 'EntryNotFound' });
    const stored = file.stored;
    const store = bucket?.() ?? null;
    if (store)
      return sendStoreBlob(req, res, {
        store,
        sha256: file.sha256 ?? '',
        cacheControl:
          route.revision === snapshot.commit ? 'public, max-age=31536000, immutable' : 'public, max-age=300',
        headers: {
          'x-repo-commit': snapshot.commit,
          'x-linked-etag': `"${file.sha256}"`,
          'x-linked-size': file.size,
        },
        missing: () =>
          hubError(req, res, 404, `${file.path} is listed in the mirror but missing from its bucket`, {
            code: 'EntryNotFound',
          }),
        log: requestLog,
      });
    const onDisk = paths.file(stored.model, stored.version, stored.file);
    // The names come from the mirror's own rows (checked when fetched); checked once more, since this is the one
    // place a Hub path turns into a path on disk.
    if (!path.resolve(onDisk).startsWith(path.resolve(paths.files) + path.sep))
      return hubError(req, res, 404, `${file.path} is not in Hangar's mirror`, { code: 'EntryNotFound' });
    return sendStoredFile(req, res, {
      onDisk,
      sha256: file.sha256 ?? '',
      // The same bytes for ever at a commit; a branch may be mirrored at a newer one tomorrow.
      cacheControl: route.revision === snapshot.commit ? 'public, max-age=31536000, immutable' : 'public, max-age=300',
      headers: {
        'x-repo-commit': snapshot.commit,
        'x-linked-etag': `"${file.sha256}"`,
        'x-linked-size': file.size,
      },
      missing: () =>
        hubError(req, res, 404, `${file.path} is listed in the mirror but missing on its disk`, {
          code: 'EntryNotFound',
        }),
      log: requestLog,
    });
  };
}
