import { createReadStream } from 'node:fs';
import fs from 'node:fs/promises';
import type { Logger } from '@hangar/common/log';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, systemActor } from '../auth/actor.js';
import type { Db } from '../db/client.js';
import { runningServers, serversStillRunning } from './migrate-servers.js';
import type { MirrorPaths } from './paths.js';
import { readStorageId } from './storage.js';
import type { MirrorStore } from './store/store.js';

// `hangar mirror migrate --to s3://…`: moves a `file` mirror's bytes into a bucket, run with every server stopped.
// Each PRESENT file's bytes go to the bucket under their sha256 (the same bytes in two versions are copied once),
// hashed as they stream: a file whose bytes on disk do not hash to the sha256 its row records stops the run before
// anything is switched. Progress needs no ledger of its own: an object under a sha256 key exists only once its
// bytes hashed right (the store keys a finished write by the hash it computed), so a re-run skips every blob
// already in the bucket, and a blob cut off half-way continues from its last checkpointed part (the store's
// MirrorUpload row, keyed `migrate-<sha256>`). Only when every blob is there are the rows switched to the bucket's
// storage id, in one audited transaction: a server started with HANGAR_MIRROR_STORE=s3://… then serves them. The
// files under the data dir stay where they are: the operator deletes them once the bucket serves.

/** The mirror cannot be moved as it is: the message says why and what to do. Nothing was switched. */
export class MirrorMigrationError extends Error {
  override name = 'MirrorMigrationError';
}

export type MigrationReport = {
  /** Files (rows) now on the bucket's storage, and the distinct blobs their PRESENT ones hold. */
  files: number;
  blobs: number;
  /** Blobs whose bytes this run sent, and those already in the bucket (an earlier run's, or another copy). */
  copied: number;
  skipped: number;
  bytesCopied: number;
  storageId: string;
  /** True when the database's mirror was on the bucket already: nothing to do. */
  already: boolean;
};

/** Files a stopped server left in these states have bytes only in a partial under the data dir: not movable. */
const UNFINISHED = new Set(['QUEUED', 'FETCHING', 'VERIFYING', 'PAUSED']);

export async function migrateMirrorToBucket(o: {
  db: Db;
  paths: MirrorPaths;
  bucket: MirrorStore;
  audit: AuditService;
  log: Logger;
  actor?: Actor;
  /** A line per blob, for the operator watching the command. */
  print?: (line: string) => void;
}): Promise<MigrationReport> {
  const { db, paths, bucket } = o;
  const print = o.print ?? (() => {});
  const actor = o.actor ?? systemActor('mirror-migrate');
  // Before anything moves, and again under the start lock before the rows switch (migrate-servers.ts).
  const running = serversStillRunning(await runningServers(db), 'Nothing was changed.');
  if (running) throw new MirrorMigrationError(running);
  const fileId = await readStorageId(paths.storageIdFile);
  const bucketId = await bucket.storageId();
  const rows = await db.mirrorFile.findMany({
    select: {
      model: true,
      version: true,
      file: true,
      state: true,
      actualSha256: true,
      bytesTotal: true,
      storageId: true,
    },
    orderBy: [{ model: 'asc' }, { version: 'asc' }, { file: 'asc' }],
  });
  const name = (r: (typeof rows)[number]) => `${r.model}/${r.version}/${r.file}`;
  if (bucketId && rows.length && rows.every((r) => r.storageId === bucketId))
    return { files: rows.length, blobs: 0, copied: 0, skipped: 0, bytesCopied: 0, storageId: bucketId, already: true };

  const foreign = rows.filter((r) => r.storageId !== null && r.storageId !== fileId && r.storageId !== bucketId);
  if (foreign.length)
    throw new MirrorMigrationError(
      `the database's mirror holds ${foreign.length} files on storage ${[...new Set(foreign.map((r) => r.storageId))].join(', ')}, which is neither this data dir's (${fileId ?? 'none'} in ${paths.storageIdFile}) nor the bucket's: run this with the HANGAR_DATA_DIR of the servers whose mirror it is. Nothing was changed.`,
    );
  const unfinished = rows.filter((r) => UNFINISHED.has(r.state));
  if (unfinished.length)
    throw new MirrorMigrationError(
      `${unfinished.length} mirror files are not finished (${unfinished
        .slice(0, 5)
        .map((r) => `${name(r)}: ${r.state}`)
        .join(
          ', ',
        )}${unfinished.length > 5 ? ', …' : ''}); their bytes so far are only in partial files under the data dir. Start the server as it was, let them finish or cancel them (in the console, or cancelMirrorFetch), stop it, and run this again. Nothing was changed.`,
    );

  // One source per blob: the first PRESENT file holding it whose bytes are on disk.
  const blobs = new Map<string, { size: number; paths: string[]; names: string[] }>();
  for (const r of rows) {
    if (r.state !== 'PRESENT') continue;
    if (!r.actualSha256)
      throw new MirrorMigrationError(
        `${name(r)} is PRESENT but its row records no sha256, so its bytes cannot be kept by content: remove it and fetch it again (or fetch it again with force), then run this again. Nothing was switched.`,
      );
    const b = blobs.get(r.actualSha256) ?? { size: Number(r.bytesTotal ?? 0), paths: [], names: [] };
    b.paths.push(paths.file(r.model, r.version, r.file));
    b.names.push(name(r));
    blobs.set(r.actualSha256, b);
  }

  let copied = 0;
  let skipped = 0;
  let bytesCopied = 0;
  for (const [sha256, b] of blobs) {
    const held = await bucket.stat(sha256);
    if (held) {
      skipped++;
      print(`in the bucket already: ${b.names[0]} (${sha256.slice(0, 12)}…)`);
      continue;
    }
    const source = await firstPresent(b.paths);
    if (!source)
      throw new MirrorMigrationError(
        `${b.names.join(', ')}: PRESENT in the database but not under ${paths.files} (looked at ${b.paths[0]}): point HANGAR_DATA_DIR at the mirror's data dir, or start the server as it was so it marks the missing files FAILED, and run this again. Nothing was switched; blobs copied so far stay in the bucket and are not copied again.`,
      );
    const w = await bucket.openWrite(`migrate-${sha256}`);
    const from = w.offset;
    try {
      for await (const chunk of createReadStream(source, { start: from, highWaterMark: 1 << 20 }))
        await w.write(chunk as Buffer);
      const done = await w.finish();
      if (done.sha256 !== sha256) {
        if (!done.held) await bucket.remove(done.sha256);
        throw new MirrorMigrationError(
          `${source} hashes to ${done.sha256}, not ${sha256} as the database records for ${b.names.join(', ')}: the copy on disk is damaged. Start the server as it was, fetch it again (retry, or remove and fetch), stop it, and run this again. Nothing was switched.`,
        );
      }
    } catch (err) {
      // The write keeps its checkpoint (a re-run continues from its last part) unless it was the wrong bytes.
      await w.close().catch(() => {});
      throw err;
    }
    copied++;
    bytesCopied += b.size - from;
    print(`copied ${b.names[0]} (${sha256.slice(0, 12)}…, ${b.size} bytes${from ? `, continued at ${from}` : ''})`);
  }

  const storageId = bucketId ?? (await bucket.claimStorageId());
  const files = await db.$transaction(async (tx) => {
    // The lock the server's start takes (storage.ts): no server judges the rows while they change storage.
    await tx.$executeRaw`SELECT pg_advisory_xact_lock(hashtext('hangar.mirror.storage'))`;
    // A server started while the blobs were copied: it holds the `file` storage, so nothing switches under it.
    const started = serversStillRunning(
      await runningServers(tx),
      'Nothing was switched; the blobs copied so far stay in the bucket and are not copied again.',
    );
    if (started) throw new MirrorMigrationError(started);
    const moved = await tx.mirrorFile.updateMany({
      where: { OR: [{ storageId: null }, { storageId: { not: storageId } }] },
      data: { storageId },
    });
    await o.audit.done(tx, actor, {
      action: 'migrateMirror',
      target: bucket.where,
      message: `${moved.count} mirror files moved from storage ${fileId ?? '(no id)'} (${paths.root}) to the bucket (${storageId}): ${copied} blobs copied (${bytesCopied} bytes), ${skipped} already there; the copies under the data dir are left in place`,
    });
    return moved.count;
  });
  o.log.info('the mirror is on the bucket now', { storage: storageId, store: bucket.where, files, copied, skipped });
  return { files, blobs: blobs.size, copied, skipped, bytesCopied, storageId, already: false };
}

async function firstPresent(candidates: string[]): Promise<string | null> {
  for (const p of candidates) {
    const s = await fs.stat(p).catch(() => null);
    if (s?.isFile()) return p;
  }
  return null;
}
