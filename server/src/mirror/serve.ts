import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '@hangar/common/log';
import type { AuditService } from '../audit/audit.service.js';
import type { AuthService } from '../auth/auth.service.js';
import type { Viewer } from '../auth/viewer.js';
import type { Db } from '../db/client.js';
import { runsModel } from '../fleet/fleet-store.js';
import { sendJson, statusOf } from '../http/reply.js';
import { credentialsOf, type Edge, needRole, type Route } from '../http/routes.js';
import type { MirrorService } from './mirror.service.js';
import { versionOwner } from './owned.js';
import type { MirrorPaths } from './paths.js';
import { sendStoredFile } from './send-file.js';
import { sendStoreBlob } from './store/send-blob.js';
import type { MirrorStore } from './store/store.js';

// GET/HEAD /mirror/<model>/<version>/<file>: what the nodes load weights from (and …/<version>/, the version's
// files as JSON, for a node fetching a set whole). Only PRESENT files, whose bytes
// were verified; a single Range (RFC 9110 §14); ETag = the file's sha256, so a node can check what it got
// against what the mirror verified; streamed from disk with backpressure.
//
// Who may read: with HANGAR_MIRROR_REQUIRE_TOKEN (the default) every request shows a credential: an API token,
// the console's session, a node token, or the server's own internal token. A published adapter that has an owner
// (it repeats what it was trained on: a team's knowledge base, say) is served only to those its owner admits,
// admins, the nodes that hold a replica of the model it adapts (they load it), and the server itself; anyone else
// gets the same 404 as for a file that does not exist, whatever the setting, so its name is not confirmed either.

type Deps = {
  db: Db;
  paths: MirrorPaths;
  auth: AuthService;
  /** Whether a signed-in caller may read what an owner key owns (OrgService.mayRead). */
  owners: { mayRead(viewer: Viewer, owner: string | null): Promise<boolean> };
  requireToken: boolean;
  internalToken: string;
  log: Logger;
  /** Counts the bytes of files sent (/metrics: hangar_mirror_sent_bytes_total). */
  sent?: (bytes: number) => void;
  /** The bucket the files are in (HANGAR_MIRROR_STORE=s3://…), known once the storage is open; null on `file`. */
  bucket?: () => MirrorStore | null;
  /** HANGAR_S3_PRESIGN: seconds of the presigned URL a node is sent to instead of the bytes; null streams them. */
  presignSeconds?: number | null;
};

// Range parsing and the file sender live in send-file.ts; re-exported so importers keep this path.
export { type ByteRange, parseRange, sendStoredFile } from './send-file.js';

/**
 * Who reads the mirror, by its token rules (shared by /mirror and the Hub's protocol on /hf): the server's own
 * internal token, or whom AuthService says the credential stands for; refused with why when a credential is
 * needed (HANGAR_MIRROR_REQUIRE_TOKEN) and none stands.
 */
export async function mirrorCaller(
  o: Pick<Deps, 'requireToken' | 'internalToken'>,
  authorization: string | null | undefined,
  identify: () => Promise<Viewer>,
): Promise<{ ok: true; viewer: Viewer } | { ok: false; reason: string; bearer: boolean }> {
  if (authorization === `Bearer ${o.internalToken}`) return { ok: true, viewer: { kind: 'system', name: 'mirror' } };
  const viewer = await identify();
  // A bearer token that was shown and refused (revoked, or a caller token, which only calls models at /v1) is
  // answered with why, even on a mirror open to anonymous callers: the script should learn its token does not
  // stand here, not be served as if it had sent none.
  const refusedBearer = viewer.kind === 'anonymous' && Boolean(viewer.reason) && Boolean(authorization);
  if ((o.requireToken || refusedBearer) && viewer.kind === 'anonymous') {
    return {
      ok: false,
      bearer: refusedBearer,
      reason:
        viewer.reason ??
        'the mirror needs a credential: Authorization: Bearer <node or API token>, or sign in to the console',
    };
  }
  return { ok: true, viewer };
}

/**
 * The credentials a mirror read is identified by: a token (`authorization`, as /hf rewrites it) or the console's
 * session; no CSRF header, because a read changes nothing.
 */
export function mirrorCredentials(req: IncomingMessage, authorization = req.headers.authorization ?? null) {
  return credentialsOf(req, { csrf: false, method: 'GET', authorization });
}

/**
 * The handler of GET/HEAD /mirror/…; `edge` (http/routes.ts) brings the caller it identified, and without one
 * (a test mounting the handler on its own socket) the caller is identified here, by the same credentials.
 */
export function serveMirror({
  db,
  paths,
  auth,
  owners,
  requireToken,
  internalToken,
  log,
  sent,
  bucket,
  presignSeconds,
}: Deps) {
  return async (req: IncomingMessage, res: ServerResponse, pathname: string, edge?: Pick<Edge, 'viewer' | 'log'>) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    const caller = await mirrorCaller(
      { requireToken, internalToken },
      req.headers.authorization,
      edge?.viewer ?? (() => auth.identify(mirrorCredentials(req))),
    );
    if (!caller.ok) {
      res.writeHead(401, { 'content-type': 'text/plain; charset=utf-8', 'www-authenticate': 'Bearer' });
      res.end(`${caller.reason}\n`);
      return;
    }
    const viewer = caller.viewer;
    const parts = pathname
      .replace(/^\/mirror\//, '')
      .split('/')
      .map((p) => {
        try {
          return decodeURIComponent(p);
        } catch {
          return '';
        }
      });
    const [model, version, ...rest] = parts;
    const file = rest.join('/');
    const notFound = (why: string) => {
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(`${why}\n`);
    };
    // GET /mirror/<model>/<version>/ (the version's URL, as a vLLM source is): what a node needs to fetch a
    // safetensors set whole, file by file, each checked against its sha256 (the ETag of its own GET).
    if (model && version && rest.length === 1 && rest[0] === '' && parts.slice(0, 2).every(safePart))
      return listVersion(db, owners, viewer, model, version, req, res, notFound);
    if (!model || !version || !file || parts.some((p) => !p || p === '..' || p === '.' || p.includes('\0')))
      return notFound('no such file in the mirror');
    // Before anything about the file is said (not even its state), so a refusal reads as "no such file".
    const owned = await versionOwner(db, model, version);
    if (owned && !(await mayFetchOwned(db, owners, viewer, owned))) return notFound('no such file in the mirror');
    const row = await db.mirrorFile.findUnique({ where: { model_version_file: { model, version, file } } });
    if (row?.state !== 'PRESENT' || !row.actualSha256) {
      return notFound(
        row ? `${model}/${version}/${file} is ${row.state.toLowerCase()}, not present` : 'no such file in the mirror',
      );
    }
    const store = bucket?.() ?? null;
    if (store)
      return sendStoreBlob(req, res, {
        store,
        sha256: row.actualSha256,
        fileName: file.split('/').at(-1),
        cacheControl: owned ? 'private, max-age=300' : 'public, max-age=300',
        // Only a node is sent to the bucket (the owners' rules above have let it through): a person's browser or a
        // script gets the bytes from Hangar, as on `file`.
        presignSeconds: viewer.kind === 'node' ? (presignSeconds ?? null) : null,
        missing: () => notFound(`${model}/${version}/${file} is listed but missing from its bucket`),
        onSent: sent,
        log: edge?.log ?? log,
      });
    return sendStoredFile(req, res, {
      onDisk: paths.file(model, version, file),
      sha256: row.actualSha256,
      // An owned adapter must not sit in a shared cache for the next caller, whoever they are.
      cacheControl: owned ? 'private, max-age=300' : 'public, max-age=300',
      missing: () => notFound(`${model}/${version}/${file} is listed but missing on disk`),
      onSent: sent,
      // The edge's logger, when there is one: its lines carry the request's id.
      log: edge?.log ?? log,
    });
  };
}

const safePart = (p: string) => Boolean(p) && p !== '..' && p !== '.' && !p.includes('\0');

/**
 * The listing of a version, as JSON: `{ model, version, complete, files: [{ name, size, sha256 }] }`, only the
 * PRESENT files (verified, so their sha256 is known); `complete` is false while any file of the version is not
 * present (still fetching, failed), and a node must not hand such a set to an engine. An owned adapter's version
 * is listed to those who may fetch its files, and is the same 404 as a missing version to anyone else.
 */
async function listVersion(
  db: Db,
  owners: Deps['owners'],
  viewer: Viewer,
  model: string,
  version: string,
  req: IncomingMessage,
  res: ServerResponse,
  notFound: (why: string) => void,
) {
  const owned = await versionOwner(db, model, version);
  if (owned && !(await mayFetchOwned(db, owners, viewer, owned))) return notFound('no such version in the mirror');
  const rows = await db.mirrorFile.findMany({ where: { model, version }, orderBy: { file: 'asc' } });
  if (!rows.length) return notFound('no such version in the mirror');
  const present = rows.filter((r) => r.state === 'PRESENT' && r.actualSha256);
  sendJson(
    res,
    200,
    {
      model,
      version,
      complete: present.length === rows.length,
      files: present.map((r) => ({ name: r.file, size: Number(r.bytesDone), sha256: r.actualSha256 })),
    },
    {
      headers: { 'cache-control': owned ? 'private, no-cache' : 'no-cache', 'x-content-type-options': 'nosniff' },
      head: req.method === 'HEAD',
    },
  );
}

/**
 * Whether this caller may fetch an owned adapter: the server's own passes; users and tokens its owner admits
 * (admins too); a node that holds a replica of the model the adapter is published for, since its replicas load
 * every adapter of that model. A node with no replica of it has no reason to hold the weights.
 */
async function mayFetchOwned(
  db: Db,
  owners: Deps['owners'],
  viewer: Viewer,
  owned: { owner: string; modelId: string | null },
): Promise<boolean> {
  if (viewer.kind === 'system') return true;
  if (viewer.kind === 'node') return owned.modelId !== null && (await runsModel(db, viewer.node.id, owned.modelId));
  return owners.mayRead(viewer, owned.owner);
}

/**
 * PUT /mirror/<model>/<version>/<file>: how Hangar's own products (trained adapters) and operators' files
 * enter the mirror, verified like a fetch: an OPERATOR token, a Content-Length, and optionally the sha256 the
 * bytes must hash to (X-Content-Sha256). A route of the HTTP edge (http/routes.ts): who may upload is its
 * declared rule, checked and audited there; what is checked here needs the request itself.
 */
export function uploadToMirror({
  mirror,
  audit,
  maxBytes,
}: {
  mirror: MirrorService;
  audit: AuditService;
  maxBytes: number;
}): Route {
  return {
    name: 'mirror upload',
    match: (path, method) => method === 'PUT' && path.startsWith('/mirror/'),
    // A token only: the console does not upload, and a session cookie on a PUT from another site must not.
    credentials: (req) => credentialsOf(req, { cookie: false, csrf: false, method: 'PUT' }),
    authorize: needRole('OPERATOR', {
      anonymous: 'an upload needs an API token: Authorization: Bearer <token>',
      notAUser: 'an upload to the mirror needs an API token of an OPERATOR; a node token only reads it',
      tooLow: (role) => `uploading to the mirror needs the OPERATOR role; this token has ${role}`,
    }),
    auditRefusal: { action: 'uploadToMirror', target: uploadTarget },
    handle: async (req, res, edge) => {
      const actor = await edge.actor();
      const segments = decodedSegments(edge.path);
      const target = uploadTarget(edge.path);
      // Every refusal of a caller who showed a credential is audited (the route's rule let only those through).
      const refuse = async (status: number, error: string, code?: string) => {
        await audit.refused(actor, 'uploadToMirror', target, printable(error));
        return sendJson(res, status, code ? { error, code } : { error });
      };
      const length = Number(req.headers['content-length'] ?? Number.NaN);
      if (!Number.isSafeInteger(length)) return refuse(411, 'an upload needs a Content-Length header');
      if (length > maxBytes) return refuse(413, `the upload is ${length} bytes; the limit is ${maxBytes}`);
      if (!segments)
        return refuse(
          400,
          'the path is not valid percent-encoding: /mirror/<model>/<version>/<file>, each part URL-encoded',
        );
      const [model = '', version = '', ...rest] = segments;
      const sha = req.headers['x-content-sha256'];
      const result = await mirror.upload(
        actor,
        { model, version, file: rest.join('/'), size: length, sha256: typeof sha === 'string' ? sha : null },
        req,
      );
      if (!result.ok) {
        // Audited already where it was refused (an owned version's refusal is filed under its owner).
        if (result.error.recorded) {
          return sendJson(res, statusOf(result.error), { error: result.error.message, code: result.error.code });
        }
        return refuse(statusOf(result.error), result.error.message, result.error.code);
      }
      const stored = result.value.files.find((x) => x.file === rest.join('/'));
      edge.log.info('mirror: upload kept', { file: target, bytes: Number(stored?.bytesDone ?? 0) });
      return sendJson(res, 201, {
        url: stored ? mirror.fileUrl(stored) : null,
        sha256: stored?.actualSha256,
        size: Number(stored?.bytesDone ?? 0),
      });
    },
  };
}

/** The path's parts after /mirror/, each decoded; null when one is not valid percent-encoding. */
function decodedSegments(pathname: string): string[] | null {
  try {
    return pathname
      .replace(/^\/mirror\//, '')
      .split('/')
      .map((p) => decodeURIComponent(p));
  } catch {
    return null;
  }
}

/**
 * An upload's target in the audit log: named as decoded (as sent when it is not valid encoding), escaped:
 * PostgreSQL refuses a NUL in text, so a NUL in a name would otherwise have stopped the audit row being written.
 */
function uploadTarget(pathname: string): string {
  const segments = decodedSegments(pathname);
  return printable(segments ? segments.join('/') : pathname.replace(/^\/mirror\//, ''));
}

/** A name or message as the audit log can hold it: control characters (NUL among them) escaped, cut at 500. */
export function printable(s: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is the point
  const escaped = s.replace(/[\u0000-\u001f\u007f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return escaped.length > 500 ? `${escaped.slice(0, 499)}…` : escaped;
}
