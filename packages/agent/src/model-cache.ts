import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { resumableDownload } from '@hangar/common/download/resumable';
import { sha256File } from '@hangar/common/download/sha256';
import { backoffMs, sleep } from '@hangar/common/retry';
import { anySignal } from './io.js';

// The node's copy of model files, by content: <dir>/models/<sha256>.gguf. A file enters only after its bytes
// hashed to the sha256 the mirror published for it (the mirror's ETag), so a replica never loads a file that
// was cut short or changed on the way; bytes still arriving live in <sha256>.gguf.part and resume with Range.
// (Every file is kept under that name, whatever it is: a safetensors shard too. A set an engine reads as a
// directory is <dir>/sets/<id>/, links under the files' own names to those, see fetchDir.)

export class ModelCacheError extends Error {
  override name = 'ModelCacheError';
}

export type CachedModel = { file: string; sha256: string; bytes: number; reused: boolean };

/** A version's files as one directory (see fetchDir): what vLLM is given as a model or a LoRA module. */
export type CachedSet = { dir: string; files: number; bytes: number; reused: boolean };

/** The mirror's listing of a version (GET /mirror/<model>/<version>/, mirror/serve.ts). */
type Listing = { complete: boolean; files: { name: string; size: number; sha256: string }[] };

export type ModelCacheOptions = {
  /** Sent to the mirror when the source is on the control plane's own origin (the mirror may need a token). */
  auth?: { origin: string; token: string };
  /** Tries per file, each resuming where the last one stopped. */
  attempts?: number;
  /** Seconds without a byte before a transfer counts as stalled and is tried again. */
  stallMs?: number;
  /** The first wait between tries; it doubles, up to 10 s. */
  backoffMs?: number;
  onProgress?: (p: { sha256: string; bytesDone: number; bytesTotal: number | null }) => void;
  /**
   * Other nodes to fetch a file from before the mirror (weights node to node, peer-fetch.ts): asked once the
   * mirror has named the file (a HEAD), for mirror sources only. Without it every byte comes from the mirror.
   */
  peers?: PeerSourcing;
  /** A rate every byte downloaded takes from (HANGAR_AGENT_TRANSFER_RATE, a test and benchmark setting). */
  throttle?: { slice(): number | null; take(bytes: number, signal?: AbortSignal): Promise<void> };
  /** Told the bytes each download moved, by where they came from (reported as the node's download bytes). */
  onBytes?: (source: 'mirror' | 'peer', bytes: number) => void;
};

/** Where the control plane says a file can be had from other nodes (peerSources); null: ask the mirror. */
export type PeerSourcing = {
  sources(
    sha256: string,
    bytes: number,
    exclude: string[],
  ): Promise<{ fromMirror: boolean; sources: { nodeId: string; node: string; url: string; ticket: string }[] } | null>;
};

/** A file this node is fetching, as other nodes may read it while it arrives (peer-server.ts). */
export type Growing = {
  partial: string;
  total: number;
  /** Bytes of it on this disk, from the start. */
  done: number;
  ended: 'ok' | 'failed' | null;
  /** Resolves at the next bytes written, or after `ms`. */
  next(ms: number): Promise<void>;
};

export class ModelCache {
  private readonly inFlight = new Map<string, Promise<CachedModel>>();
  private readonly setsInFlight = new Map<string, Promise<CachedSet>>();
  private readonly arriving = new Map<string, Growing & { wake: Set<() => void> }>();

  constructor(
    readonly dir: string,
    private readonly o: ModelCacheOptions = {},
  ) {}

  get modelsDir() {
    return path.join(this.dir, 'models');
  }

  /**
   * Brings the file at `source` into the cache, or finds it there, and returns where it is. Two replicas of one
   * model share one download. Throws ModelCacheError with the reason an operator can act on.
   */
  fetch(source: string, signal?: AbortSignal): Promise<CachedModel> {
    const running = this.inFlight.get(source);
    if (running) return running;
    const p = this.download(source, signal).finally(() => this.inFlight.delete(source));
    this.inFlight.set(source, p);
    return p;
  }

  /**
   * The file llama.cpp should load for a source. A split model's source is its first shard
   * (…-00001-of-00003.gguf), and llama.cpp finds the others by name beside it: every shard is fetched (each
   * checked against its own ETag) and linked under its own name in a folder of its own, and the first returned.
   */
  async fetchModel(source: string, signal?: AbortSignal): Promise<CachedModel & { shards: number }> {
    const url = new URL(source);
    const m = url.pathname.match(/^(.*-)(\d{5})-of-(\d{5})\.gguf$/);
    const count = Number(m?.[3] ?? 1);
    if (!m || count <= 1) return { ...(await this.fetch(source, signal)), shards: 1 };
    if (Number(m[2]) !== 1)
      throw new ModelCacheError(`${source} is shard ${Number(m[2])} of ${count}: a split model loads from its first`);
    const shards: { name: string; model: CachedModel }[] = [];
    for (let i = 1; i <= count; i++) {
      const shard = new URL(url);
      shard.pathname = `${m[1]}${String(i).padStart(5, '0')}-of-${m[3]}.gguf`;
      const name = path.basename(decodeURIComponent(shard.pathname));
      shards.push({ name, model: await this.fetch(shard.toString(), signal) });
    }
    const first = shards[0]!.model;
    const folder = path.join(this.modelsDir, `split-${first.sha256}`);
    await fs.mkdir(folder, { recursive: true });
    for (const s of shards) {
      const link = path.join(folder, s.name);
      await fs.rm(link, { force: true });
      await fs.symlink(path.join('..', path.basename(s.model.file)), link);
    }
    return {
      file: path.join(folder, shards[0]!.name),
      sha256: first.sha256,
      bytes: shards.reduce((n, s) => n + s.model.bytes, 0),
      reused: shards.every((s) => s.model.reused),
      shards: count,
    };
  }

  /**
   * A mirror version's whole set of files (a safetensors model, a PEFT adapter) as one directory an engine reads:
   * <dir>/sets/<digest of the listing>/<name>, each name a link to its file in models/, which entered the cache
   * only once its bytes hashed to the sha256 the mirror lists for it (each fetched as `fetch` fetches, resuming).
   * The directory appears, whole, only after every file is verified: an engine is never handed part of a set. A
   * set already there is reused once each of its files hashes right again; two replicas share one fetch.
   */
  fetchDir(versionUrl: string, signal?: AbortSignal): Promise<CachedSet> {
    const running = this.setsInFlight.get(versionUrl);
    if (running) return running;
    const p = this.downloadSet(versionUrl, signal).finally(() => this.setsInFlight.delete(versionUrl));
    this.setsInFlight.set(versionUrl, p);
    return p;
  }

  private async downloadSet(versionUrl: string, signal?: AbortSignal): Promise<CachedSet> {
    if (!versionUrl.endsWith('/'))
      throw new ModelCacheError(
        `${versionUrl} is not a mirror version (…/mirror/<model>/<version>/): a set of files is fetched whole from the mirror's listing of a version; serve the model from its mirror version`,
      );
    const listing = await this.list(versionUrl, signal);
    if (!listing.complete)
      throw new ModelCacheError(
        `${versionUrl}: the mirror holds only part of this version (${listing.files.length} files verified, others still fetching or failed), and a set is used whole: retry the version in the mirror, then start the replica again`,
      );
    if (!listing.files.length) throw new ModelCacheError(`${versionUrl}: the mirror lists no file in this version`);
    const files = [...listing.files].sort((a, b) => a.name.localeCompare(b.name));
    const sets = path.join(this.dir, 'sets');
    const id = createHash('sha256')
      .update(JSON.stringify(files.map((f) => [f.name, f.sha256])))
      .digest('hex');
    const dir = path.join(sets, id);
    let reused = true;
    let bytes = 0;
    const blobs: string[] = [];
    for (const f of files) {
      // The listing gives the sha256, so a file already here is checked without asking the mirror again.
      let got: CachedModel | undefined = await this.verified(f.sha256);
      if (!got) {
        got = await this.fetch(versionUrl + f.name.split('/').map(encodeURIComponent).join('/'), signal);
        reused = false;
      }
      if (got.sha256 !== f.sha256 || got.bytes !== f.size)
        throw new ModelCacheError(
          `${versionUrl}${f.name}: the mirror lists ${f.size} bytes with sha256 ${f.sha256}, but served ${got.bytes} bytes with sha256 ${got.sha256}: the version changed while it was fetched; start the replica again`,
        );
      bytes += got.bytes;
      blobs.push(got.file);
    }
    signal?.throwIfAborted();
    const target = (name: string, blob: string) => path.relative(path.dirname(path.join(dir, name)), blob);
    const links = await Promise.all(files.map((f) => fs.readlink(path.join(dir, f.name)).catch(() => null)));
    if (links.every((l, i) => l === target(files[i]!.name, blobs[i]!)))
      return { dir, files: files.length, bytes, reused };
    // Built beside it and renamed into place, so the directory is either absent or whole.
    const building = path.join(sets, `${id}.part-${process.pid}-${Date.now()}`);
    await fs.mkdir(building, { recursive: true });
    try {
      for (const [i, f] of files.entries()) {
        const link = path.join(building, f.name);
        await fs.mkdir(path.dirname(link), { recursive: true });
        await fs.symlink(target(f.name, blobs[i]!), link);
      }
      await fs.rm(dir, { recursive: true, force: true });
      await fs.rename(building, dir);
    } catch (err) {
      await fs.rm(building, { recursive: true, force: true });
      throw err;
    }
    return { dir, files: files.length, bytes, reused: false };
  }

  /** The mirror's listing of a version, checked: names that stay inside the set, sha256s as the mirror gives them. */
  /** The wait before retry n (1, 2, …) of a listing or a download: from backoffMs (500 ms) doubling to 10 s. */
  private retryWaitMs(n: number) {
    return backoffMs(n - 1, { baseMs: this.o.backoffMs ?? 500, maxMs: 10_000 });
  }

  private async list(versionUrl: string, signal?: AbortSignal): Promise<Listing> {
    const headers: Record<string, string> = { accept: 'application/json', ...this.authFor(versionUrl) };
    const attempts = this.o.attempts ?? 6;
    let lastError = '';
    for (let i = 1; i <= attempts; i++) {
      signal?.throwIfAborted();
      let res: Response;
      try {
        res = await fetch(versionUrl, {
          headers,
          signal: anySignal(signal, AbortSignal.timeout(this.o.stallMs ?? 30_000)),
        });
      } catch (err) {
        if (signal?.aborted) throw signal.reason ?? err;
        lastError = describe(err);
        if (i < attempts) await sleep(this.retryWaitMs(i), signal);
        continue;
      }
      const text = await res.text();
      if (res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429)
        throw new ModelCacheError(
          `${versionUrl}: the mirror answered ${res.status} to the version's listing${text.trim() ? `: ${text.trim().slice(0, 200)}` : ''}`,
        );
      if (res.status === 200) return parseListing(versionUrl, text);
      lastError = `the mirror answered ${res.status}`;
      if (i < attempts) await sleep(this.retryWaitMs(i), signal);
    }
    throw new ModelCacheError(
      `${versionUrl}: the version's listing could not be read in ${attempts} tries: ${lastError}`,
    );
  }

  /**
   * The one resumable download (lib/download/resumable.ts), by content: the part is named by the sha256 the
   * mirror publishes as the ETag (a part left by an earlier run resumes), a file already in the cache is checked
   * again and reused, and a file enters the cache only once its bytes hash to that sha256.
   */
  private async download(source: string, signal?: AbortSignal): Promise<CachedModel> {
    await fs.mkdir(this.modelsDir, { recursive: true });
    // From the mirror, the sha256 is asked of its HEAD first, peers or not: with HANGAR_S3_PRESIGN=on its GET is a
    // redirect to the bucket, whose ETag is no sha256, so the answer followed cannot name the file by itself.
    if (this.o.auth && new URL(source).origin === this.o.auth.origin) {
      const named = await this.named(source, signal);
      if (named) return this.downloadShared(source, named, signal);
    }
    const attempts = this.o.attempts ?? 6;
    let reused: CachedModel | undefined;
    const counted = this.counter('mirror');
    const result = await resumableDownload({
      url: source,
      partialPath: (sha256) => path.join(this.modelsDir, `${sha256}.gguf.part`),
      headers: this.authFor(source),
      attempts: { maxAttempts: attempts, backoffMs: (n) => this.retryWaitMs(n) },
      stallMs: this.o.stallMs ?? 30_000,
      expect: { sha256: 'upstream' },
      fsync: true, // the cache outlives a crash of the node: a file in it must be whole
      signal,
      beforeBody: async (head) => {
        reused = head.upstreamSha256 ? await this.verified(head.upstreamSha256) : undefined;
        return reused ? { held: true } : null;
      },
      throttle: this.o.throttle,
      onProgress: (p) => {
        counted(p);
        if (p.upstreamSha256)
          this.o.onProgress?.({ sha256: p.upstreamSha256, bytesDone: p.bytesDone, bytesTotal: p.bytesTotal });
      },
    });
    if (result.ok && result.held && reused) {
      await fs.rm(result.partialPath, { force: true });
      return reused;
    }
    if (result.ok) {
      const file = this.fileFor(result.sha256);
      await fs.rename(result.partialPath, file);
      return { file, sha256: result.sha256, bytes: result.size, reused: false };
    }
    if (result.kind === 'cancelled') throw signal?.reason ?? new Error('cancelled');
    if (result.kind === 'status')
      throw new ModelCacheError(
        `${source}: the mirror answered ${result.status}${result.text ? `: ${result.text}` : ''}`,
      );
    if (result.kind === 'mismatch' && result.got)
      throw new ModelCacheError(
        `the downloaded file's sha256 is ${result.got.sha256}, but the mirror says ${result.got.wanted}: the bytes were changed on the way, so the file was not kept`,
      );
    if (result.kind === 'attempts')
      throw new ModelCacheError(`${source} could not be fetched in ${attempts} tries: ${result.last}`);
    throw new ModelCacheError(`${source}: ${result.reason}`);
  }

  /**
   * Weights node to node: the file the mirror names (by a HEAD: its sha256 and size, no bytes) is fetched from
   * the nodes the control plane offers, each tried in turn and resumed from where the last stopped (one partial,
   * by sha256, whatever the source), then from the mirror: when none is offered (this node is the one to fetch
   * it from there), when all failed, or when the control plane cannot be asked. The sha256 the mirror published
   * is checked either way; a peer's own ETag is not believed.
   */
  private async downloadShared(
    source: string,
    named: { sha256: string; bytes: number },
    signal?: AbortSignal,
  ): Promise<CachedModel> {
    const { sha256, bytes } = named;
    const held = await this.verified(sha256);
    if (held) return held;
    const partial = path.join(this.modelsDir, `${sha256}.gguf.part`);
    // There before the control plane hears of this fetch: a node sent here for its bytes must find the file.
    await fs.appendFile(partial, '');
    const g = this.startArriving(sha256, partial, bytes);
    try {
      const exclude: string[] = [];
      // A few rounds: each asks again without the nodes that failed, so a node gone mid-transfer is replaced.
      for (let round = 0; round < 4; round++) {
        signal?.throwIfAborted();
        const plan = await this.o.peers?.sources(sha256, bytes, exclude).catch(() => null);
        if (!plan || plan.fromMirror || !plan.sources.length) break;
        for (const s of plan.sources) {
          const result = await this.transfer(s.url, { authorization: `Bearer ${s.ticket}` }, named, partial, 'peer', {
            signal,
            peer: true,
          });
          if (result.ok) return await this.enter(result, g);
          if (result.kind === 'cancelled') throw signal?.reason ?? new Error('cancelled');
          exclude.push(s.nodeId);
        }
      }
      const result = await this.transfer(source, this.authFor(source), named, partial, 'mirror', { signal });
      if (result.ok) return await this.enter(result, g);
      if (result.kind === 'cancelled') throw signal?.reason ?? new Error('cancelled');
      if (result.kind === 'status')
        throw new ModelCacheError(
          `${source}: the mirror answered ${result.status}${result.text ? `: ${result.text}` : ''}`,
        );
      if (result.kind === 'mismatch' && result.got)
        throw new ModelCacheError(
          `the downloaded file's sha256 is ${result.got.sha256}, but the mirror says ${sha256}: the bytes were changed on the way, so the file was not kept`,
        );
      throw new ModelCacheError(`${source}: ${result.reason}`);
    } finally {
      this.endArriving(sha256, g);
    }
  }

  /** One source's try at the file, into the shared partial, counting its bytes as that source's. */
  private transfer(
    url: string,
    headers: Record<string, string>,
    named: { sha256: string; bytes: number },
    partial: string,
    from: 'mirror' | 'peer',
    o: { signal?: AbortSignal; peer?: boolean },
  ) {
    const counted = this.counter(from);
    const g = this.arriving.get(named.sha256);
    return resumableDownload({
      url,
      partialPath: partial,
      headers,
      // Another node is given two tries in a row that bring nothing, quickly: the next source is waiting.
      attempts: o.peer
        ? { maxAttempts: 2, backoffMs: () => 200 }
        : { maxAttempts: this.o.attempts ?? 6, backoffMs: (n) => this.retryWaitMs(n) },
      stallMs: this.o.stallMs ?? 30_000,
      expect: { sha256: named.sha256, size: named.bytes },
      fsync: true,
      throttle: this.o.throttle,
      signal: o.signal,
      onProgress: (p) => {
        counted(p);
        if (g) {
          g.done = p.bytesDone;
          for (const w of g.wake) w();
        }
        this.o.onProgress?.({ sha256: named.sha256, bytesDone: p.bytesDone, bytesTotal: p.bytesTotal });
      },
    });
  }

  /** A verified partial, into the cache under its sha256. */
  private async enter(result: { partialPath: string; sha256: string; size: number }, g: Growing): Promise<CachedModel> {
    const file = this.fileFor(result.sha256);
    await fs.rename(result.partialPath, file);
    g.ended = 'ok';
    return { file, sha256: result.sha256, bytes: result.size, reused: false };
  }

  /** Counts the bytes a download moves: the growth of its offset between two reports (a resume's start is not). */
  private counter(from: 'mirror' | 'peer') {
    let last: number | null = null;
    return (p: { bytesDone: number }) => {
      if (last !== null && p.bytesDone > last) this.o.onBytes?.(from, p.bytesDone - last);
      last = p.bytesDone;
    };
  }

  /** What the mirror says a file is, from a HEAD: its sha256 (ETag) and size; null when it will not say. */
  private async named(source: string, signal?: AbortSignal): Promise<{ sha256: string; bytes: number } | null> {
    try {
      const res = await fetch(source, {
        method: 'HEAD',
        headers: this.authFor(source),
        signal: anySignal(signal, AbortSignal.timeout(this.o.stallMs ?? 30_000)),
      });
      const sha256 = res.headers.get('etag')?.replace(/^"|"$/g, '') ?? '';
      const bytes = Number(res.headers.get('content-length'));
      if (res.status !== 200 || !/^[0-9a-f]{64}$/.test(sha256) || !Number.isSafeInteger(bytes)) return null;
      return { sha256, bytes };
    } catch (err) {
      if (signal?.aborted) throw signal.reason ?? err;
      return null;
    }
  }

  private startArriving(sha256: string, partial: string, total: number) {
    const wake = new Set<() => void>();
    const g: Growing & { wake: Set<() => void> } = {
      partial,
      total,
      done: 0,
      ended: null,
      wake,
      next: (ms) =>
        new Promise<void>((resolve) => {
          const done = () => {
            clearTimeout(timer);
            wake.delete(done);
            resolve();
          };
          const timer = setTimeout(done, ms);
          wake.add(done);
        }),
    };
    this.arriving.set(sha256, g);
    return g;
  }

  private endArriving(sha256: string, g: Growing & { wake: Set<() => void> }) {
    if (g.ended === null) g.ended = 'failed';
    for (const w of g.wake) w();
    if (this.arriving.get(sha256) === g) this.arriving.delete(sha256);
  }

  /** A file this node is fetching now, for other nodes to read as it arrives. */
  growing(sha256: string): Growing | undefined {
    return this.arriving.get(sha256);
  }

  /** Files being fetched now, by sha256 (reported to the control plane). */
  fetchingFiles(): { sha256: string; bytes: number }[] {
    return [...this.arriving.entries()].map(([sha256, g]) => ({ sha256, bytes: g.total }));
  }

  /**
   * A whole file in the cache, by its name alone: it entered verified, and hashing gigabytes again for every
   * node that asks would cost more than the asker's own check, which it makes anyway.
   */
  async heldFile(sha256: string): Promise<{ file: string; bytes: number } | undefined> {
    if (!/^[0-9a-f]{64}$/.test(sha256)) return undefined;
    const file = this.fileFor(sha256);
    const st = await fs.stat(file).catch(() => undefined);
    return st?.isFile() ? { file, bytes: st.size } : undefined;
  }

  /** Every whole file in the cache (reported to the control plane, for other nodes to fetch). */
  async heldFiles(): Promise<{ sha256: string; bytes: number }[]> {
    const names = await fs.readdir(this.modelsDir).catch(() => [] as string[]);
    const out: { sha256: string; bytes: number }[] = [];
    for (const name of names) {
      const m = name.match(/^([0-9a-f]{64})\.gguf$/);
      if (!m?.[1]) continue;
      const held = await this.heldFile(m[1]);
      if (held) out.push({ sha256: m[1], bytes: held.bytes });
    }
    return out;
  }

  /** The node token, for the control plane's own mirror only. */
  private authFor(url: string): Record<string, string> {
    return this.o.auth && new URL(url).origin === this.o.auth.origin
      ? { authorization: `Bearer ${this.o.auth.token}` }
      : {};
  }

  /**
   * A cached file, checked again before it is used: a file only enters the cache verified, but a disk fault
   * or a person's hand can change it since, and a replica that loads wrong weights fails in confusing ways.
   * A file that no longer matches is removed and fetched again.
   */
  fileFor(sha256: string) {
    return path.join(this.modelsDir, `${sha256}.gguf`);
  }

  private async verified(sha256: string): Promise<CachedModel | undefined> {
    const file = this.fileFor(sha256);
    const st = await fs.stat(file).catch(() => undefined);
    if (!st?.isFile()) return undefined;
    const { sha256: actual } = await sha256File(file);
    if (actual === sha256) return { file, sha256, bytes: st.size, reused: true };
    await fs.rm(file, { force: true });
    return undefined;
  }
}

function parseListing(versionUrl: string, text: string): Listing {
  const bad = (why: string) =>
    new ModelCacheError(
      `${versionUrl}: the answer is not a mirror version's listing (${why}); is the source a mirror version's URL?`,
    );
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw bad('not JSON');
  }
  const b = body as Partial<Listing>;
  if (typeof b !== 'object' || b === null || !Array.isArray(b.files)) throw bad('no "files"');
  for (const f of b.files) {
    if (typeof f?.name !== 'string' || typeof f.size !== 'number' || !/^[0-9a-f]{64}$/.test(String(f.sha256)))
      throw bad('a file without a name, a size and a sha256');
    // The names become paths under the set's directory: none may leave it.
    const parts = f.name.split('/');
    if (f.name.startsWith('/') || parts.some((p) => !p || p === '.' || p === '..' || p.includes('\0')))
      throw bad(`the file name ${JSON.stringify(f.name)} is not a relative path inside the version`);
  }
  return { complete: b.complete === true, files: b.files };
}

function describe(err: unknown): string {
  const e = err as { message?: string; cause?: { code?: string; message?: string } };
  const cause = e.cause?.code ?? e.cause?.message;
  return cause ? `${e.message} (${cause})` : String(e.message ?? err);
}
