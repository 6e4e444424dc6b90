import { createHash } from 'node:crypto';
import type { Db } from '../db/client.js';
import { fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { isCommit, namedCommits } from './hub-refs.js';

// The mirror seen as the Hugging Face Hub sees repositories: a repository at a commit, with files by path. The
// mirror keeps files by Hangar's names (model/version/file); what ties a file to a Hub repository is the URL it
// was fetched from, `<hub>/<owner>/<repo>/resolve/<commit>/<path>`, which is how the registry (and a script
// that mirrors a Hub URL by hand) fetches. Only PRESENT files, whose bytes were verified against their sha256:
// a client that is told a file is here must get exactly those bytes.

/** A Hub repository id: `owner/name`, or a legacy one-part name (`gpt2`), as the Hub accepts. */
const REPO_PART = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$/;
const COMMIT = /^[0-9a-f]{40}$/;

/** A full commit sha: a revision that names itself; anything else (main, a tag) is a name the Hub resolves. */
// Defined beside the refs it tells apart from branch names; exported here too for the importers of this path.
export { isCommit };

/** A repository is not mirrored: the Hub says RepoNotFound, and clients fail the way they would there. */
export class RepoNotMirroredError extends NotFoundError {
  readonly hubCode = 'RepoNotFound';
}
/** The repository is mirrored, but not at that commit. */
export class RevisionNotMirroredError extends NotFoundError {
  readonly hubCode = 'RevisionNotFound';
}
/** The repository is mirrored at that revision, without that file (or folder). */
export class EntryNotMirroredError extends NotFoundError {
  readonly hubCode = 'EntryNotFound';
}

export type HfFile = {
  /** Its path in the repository, as the Hub names it. */
  path: string;
  size: number;
  /** Null only for a file the Hub lists without one (kept in Git, not LFS) that the mirror does not hold yet. */
  sha256: string | null;
  /** Where the mirror keeps it; null for a file only the Hub holds so far (pull-through lists it, then fetches it). */
  stored: { model: string; version: string; file: string } | null;
  finishedAt: Date | null;
  /** The Hub's Git blob id, for a file listed from the Hub: what its tree listing says for a file not in LFS. */
  oid?: string;
};

export type HfSnapshot = {
  /** The repository id as it was fetched (the Hub's spelling, whatever case the client asked in). */
  id: string;
  /** The commit the files were fetched at. */
  commit: string;
  files: HfFile[];
  /** When its newest file arrived: the Hub's lastModified for what the mirror holds. */
  lastModified: Date | null;
  createdAt: Date | null;
};

/** One entry of the Hub's tree listing (`GET /api/models/{repo}/tree/{rev}[/path]`). */
export type HfTreeEntry =
  | { type: 'file'; oid: string; size: number; path: string; lfs?: { oid: string; size: number; pointerSize: number } }
  | { type: 'directory'; oid: string; size: 0; path: string };

/**
 * Every file is presented as the Hub presents a Git LFS file: the mirror holds the bytes and their sha256, not
 * a Git blob, so the blob id is that of the LFS pointer the sha256 and size make, as it would be on the Hub.
 */
export function lfsPointer(sha256: string, size: number) {
  const text = `version https://git-lfs.github.com/spec/v1\noid sha256:${sha256}\nsize ${size}\n`;
  const bytes = Buffer.byteLength(text);
  const oid = createHash('sha1').update(`blob ${bytes}\0`).update(text).digest('hex');
  return { oid, pointerSize: bytes };
}

export class HfMirror {
  constructor(
    private readonly o: {
      db: Db;
      /** The Hub the registry fetches from (its path, if it has one, is part of every resolve URL); null when off. */
      hubUrl: string | null;
    },
  ) {}

  /** Checks a repository id and a path as the Hub would take them; a refusal names what is wrong. */
  validate(repo: string, path?: string): Result<void> {
    const parts = repo.split('/');
    if (parts.length > 2 || !parts.every((p) => REPO_PART.test(p) && !p.includes('..')))
      return fail(
        new ValidationError(
          'repo',
          `${printable(repo)} is not a repository id: owner/name, each letters, digits, '.', '_' and '-' (no '..')`,
        ),
      );
    if (path !== undefined && path !== '') {
      // biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is the point
      const control = /[\u0000-\u001f\u007f]/;
      const bad = path
        .split('/')
        .find((p) => p === '' || p === '.' || p === '..' || p.includes('\\') || control.test(p));
      if (bad !== undefined)
        return fail(
          new ValidationError(
            'path',
            `${printable(path)} is not a file path in a repository: folders separated by single '/', no '.', '..', '\\' or control characters`,
          ),
        );
    }
    return ok(undefined);
  }

  /**
   * The repository at a revision: a full commit sha answers that commit, if it was mirrored; any other name (a
   * branch such as main, a tag) answers the commit the Hub named for it when Hangar last asked (hub-refs.ts), and
   * only a name Hangar never asked the Hub about answers the commit mirrored last.
   */
  async snapshot(repo: string, revision: string): Promise<Result<HfSnapshot>> {
    const valid = this.validate(repo);
    if (!valid.ok) return valid;
    const rows = await this.o.db.mirrorFile.findMany({
      where: {
        state: 'PRESENT',
        actualSha256: { not: null },
        sourceUrl: { contains: `/${repo}/resolve/`, mode: 'insensitive' },
      },
      select: {
        model: true,
        version: true,
        file: true,
        sourceUrl: true,
        actualSha256: true,
        bytesDone: true,
        finishedAt: true,
      },
    });
    const byCommit = new Map<string, { id: string; files: Map<string, HfFile> }>();
    for (const r of rows) {
      const source = this.hubPath(r.sourceUrl, repo);
      if (!source || !r.actualSha256) continue;
      const commit = byCommit.get(source.commit) ?? { id: source.id, files: new Map() };
      byCommit.set(source.commit, commit);
      const known = commit.files.get(source.path);
      // The same file mirrored into two versions (two sets of one repository): the newer copy is served.
      if (known && (known.finishedAt?.getTime() ?? 0) >= (r.finishedAt?.getTime() ?? 0)) continue;
      commit.files.set(source.path, {
        path: source.path,
        size: Number(r.bytesDone),
        sha256: r.actualSha256,
        stored: { model: r.model, version: r.version, file: r.file },
        finishedAt: r.finishedAt,
      });
    }
    if (!byCommit.size) return fail(new RepoNotMirroredError(`${repo} is not in Hangar's mirror`));
    const newest = (files: Iterable<HfFile>) => Math.max(0, ...[...files].map((f) => f.finishedAt?.getTime() ?? 0));
    let commit: string | undefined;
    if (COMMIT.test(revision)) {
      if (!byCommit.has(revision))
        return fail(
          new RevisionNotMirroredError(
            `${repo} is mirrored at ${[...byCommit.keys()].join(', ')}, not at ${revision}: fetch that revision into the mirror first`,
          ),
        );
      commit = revision;
    } else {
      const named = await namedCommits(this.o.db, repo, revision);
      if (named.length) {
        // The newest commit the Hub named for it that the mirror holds: while a new main downloads, the one before.
        commit = named.find((c) => byCommit.has(c));
        if (!commit)
          return fail(
            new RevisionNotMirroredError(
              `${repo} at ${revision} is commit ${named[0]} on the Hub, which Hangar's mirror does not hold yet: wait for its fetch to finish, or ask for a mirrored commit (${[...byCommit.keys()].join(', ')}) by its sha`,
            ),
          );
      } else {
        // Never resolved through the registry or pull-through (its files were fetched by hand, by commit): the
        // newest commit fetched from the Hub's origin is the best guess there is.
        commit = [...byCommit.entries()].sort(
          (a, b) => newest(b[1].files.values()) - newest(a[1].files.values()),
        )[0]?.[0];
      }
    }
    const found = byCommit.get(commit ?? '');
    if (!commit || !found) return fail(new RepoNotMirroredError(`${repo} is not in Hangar's mirror`));
    const files = [...found.files.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
    const times = files.map((f) => f.finishedAt?.getTime() ?? 0).filter(Boolean);
    return ok({
      id: found.id,
      commit,
      files,
      lastModified: times.length ? new Date(Math.max(...times)) : null,
      createdAt: times.length ? new Date(Math.min(...times)) : null,
    });
  }

  /** One file of the repository at a revision. */
  async file(repo: string, revision: string, path: string): Promise<Result<{ snapshot: HfSnapshot; file: HfFile }>> {
    const valid = this.validate(repo, path);
    if (!valid.ok) return valid;
    const snap = await this.snapshot(repo, revision);
    if (!snap.ok) return snap;
    const file = snap.value.files.find((f) => f.path === path);
    if (!file)
      return fail(new EntryNotMirroredError(`${path} of ${repo} at ${snap.value.commit} is not in Hangar's mirror`));
    return ok({ snapshot: snap.value, file });
  }

  /**
   * The Hub's tree listing under a folder ('' for the top): its files and folders, or with `recursive` every
   * file and folder below it.
   */
  tree(snapshot: HfSnapshot, dir: string, recursive: boolean): Result<HfTreeEntry[]> {
    const valid = this.validate(snapshot.id, dir);
    if (!valid.ok) return valid;
    const prefix = dir ? `${dir}/` : '';
    const below = snapshot.files.filter((f) => f.path.startsWith(prefix));
    if (dir && !below.length)
      return fail(
        new EntryNotMirroredError(`${dir} of ${snapshot.id} at ${snapshot.commit} is not in Hangar's mirror`),
      );
    const entries = new Map<string, HfTreeEntry>();
    for (const f of below) {
      const rest = f.path.slice(prefix.length).split('/');
      // Each folder on the way to the file, as far as the listing reaches.
      for (let depth = 1; depth < rest.length && (recursive || depth === 1); depth++) {
        const folder = prefix + rest.slice(0, depth).join('/');
        if (!entries.has(folder))
          entries.set(folder, { type: 'directory', oid: folderOid(snapshot, folder), size: 0, path: folder });
      }
      if (!recursive && rest.length > 1) continue;
      if (f.sha256 === null) {
        entries.set(f.path, { type: 'file', oid: f.oid ?? folderOid(snapshot, f.path), size: f.size, path: f.path });
        continue;
      }
      const lfs = lfsPointer(f.sha256, f.size);
      entries.set(f.path, {
        type: 'file',
        oid: lfs.oid,
        size: f.size,
        path: f.path,
        lfs: { oid: f.sha256, size: f.size, pointerSize: lfs.pointerSize },
      });
    }
    return ok([...entries.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0)));
  }

  /**
   * The repository id, commit and path a mirrored file was fetched from, when its URL is a Hub resolve URL of
   * this repository at a commit. Files fetched by a branch (`resolve/main/…`) are left out: the branch may have
   * moved while they were fetched, so no commit can be claimed for them. Only the Hub's own files count
   * (HANGAR_HUB_URL's origin, under its path): any other server answers a path shaped like one with bytes of
   * its choosing, and an operator who fetched 2 bytes from one under a made-up commit would otherwise have them
   * served as the repository's file to every client of /hf.
   */
  private hubPath(sourceUrl: string, repo: string): { id: string; commit: string; path: string } | null {
    if (!this.o.hubUrl) return null;
    let source: URL;
    let hub: URL;
    try {
      source = new URL(sourceUrl);
      hub = new URL(this.o.hubUrl);
    } catch {
      return null;
    }
    if (source.origin !== hub.origin) return null;
    const pathname = source.pathname;
    // The Hub's own path prefix: an internal Hub at https://host/hub serves its files under /hub/….
    const base = hub.pathname.replace(/\/+$/, '');
    if (!pathname.startsWith(`${base}/`)) return null;
    const parts = pathname.slice(base.length + 1).split('/');
    const width = repo.split('/').length;
    const id = parts.slice(0, width).join('/');
    if (id.toLowerCase() !== repo.toLowerCase() || parts[width] !== 'resolve') return null;
    const [commit, ...rest] = parts.slice(width + 1).map((p) => {
      try {
        return decodeURIComponent(p);
      } catch {
        return '';
      }
    });
    const path = rest.join('/');
    if (!commit || !COMMIT.test(commit) || !path || !this.validate(id, path).ok) return null;
    return { id, commit, path };
  }
}

/** A GGUF as llama.cpp's manifest names it: path, `sha256:<digest>` and size. */
export type ManifestFile = { rfilename: string; blobId: string; size: number };

/**
 * What `llama-cli -hf owner/repo[:quant]` (and node-llama-cpp's `hf:` URIs) ask for first: the GGUF for a
 * quantisation tag (`latest` prefers Q4_K_M, as the Hub does), the first shard of a split set, and a vision
 * projector beside it when the repository has one.
 */
export function ggufManifest(
  snapshot: HfSnapshot,
  tag: string,
): Result<{ ggufFile: ManifestFile; mmprojFile?: ManifestFile }> {
  const ggufs = snapshot.files.filter((f) => f.path.toLowerCase().endsWith('.gguf') && f.sha256 !== null);
  const mmproj = ggufs.filter((f) => /mmproj/i.test(f.path));
  const weights = ggufs.filter((f) => !/mmproj|imatrix/i.test(f.path));
  const named = (quant: string) => {
    const bounded = new RegExp(`(^|[-._/])${quant.replace(/[^A-Za-z0-9_]/g, '\\$&')}([-._/]|$)`, 'i');
    return weights.filter((f) => bounded.test(f.path));
  };
  // A split set answers with its first shard; llama.cpp fetches the others by their names.
  const first = (files: HfFile[]) =>
    files.find((f) => /-00001-of-\d{5}\.gguf$/i.test(f.path)) ??
    files.find((f) => !/-\d{5}-of-\d{5}\.gguf$/i.test(f.path));
  const picked = tag.toLowerCase() === 'latest' ? (first(named('Q4_K_M')) ?? first(weights)) : first(named(tag));
  if (!picked)
    return fail(
      new EntryNotMirroredError(
        `${snapshot.id} at ${snapshot.commit} has no GGUF for ${JSON.stringify(tag)} in Hangar's mirror`,
      ),
    );
  const entry = (f: HfFile): ManifestFile => ({ rfilename: f.path, blobId: `sha256:${f.sha256}`, size: f.size });
  const projector = mmproj[0];
  return ok({ ggufFile: entry(picked), ...(projector ? { mmprojFile: entry(projector) } : {}) });
}

/** A stable id for a folder at a commit: the mirror holds no Git trees, and clients only compare these. */
function folderOid(snapshot: HfSnapshot, folder: string): string {
  return createHash('sha1').update(`tree:${snapshot.id}:${snapshot.commit}:${folder}`).digest('hex');
}

/** A name as a message can show it: control characters escaped, cut at 200. */
function printable(s: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is the point
  const escaped = s.replace(/[\u0000-\u001f\u007f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return JSON.stringify(escaped.length > 200 ? `${escaped.slice(0, 199)}…` : escaped);
}
