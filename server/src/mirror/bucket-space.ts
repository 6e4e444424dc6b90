import type { Db } from '../db/client.js';

// A bucket has no free space to ask for: what the operator watches is what the mirror keeps there (the bill, or
// the bucket's quota at MinIO or Ceph RGW). So on HANGAR_MIRROR_STORE=s3://… the mirror's figures are the bytes it
// holds in the bucket, counted from PostgreSQL (each distinct sha256 once: the keys are content-addressed, so two
// versions with the same bytes hold one object), not a ListObjects scan on every request, which costs a request
// per 1,000 objects and is billed. With HANGAR_S3_QUOTA set, that quota is the room a fetch has: one that would
// pass it is refused before a byte moves, as a fetch that would fill the disk is on `file`.

const UNITS: Record<string, number> = {
  b: 1,
  kb: 1e3,
  mb: 1e6,
  gb: 1e9,
  tb: 1e12,
  kib: 1024,
  mib: 1024 ** 2,
  gib: 1024 ** 3,
  tib: 1024 ** 4,
};

/** HANGAR_S3_QUOTA: "500GiB", "2TB", plain bytes; "" or "off" for none (null). A message when unreadable. */
export function parseQuota(v: string): number | null | string {
  const text = v.trim().toLowerCase().replace(/\s+/g, '');
  if (text === '' || text === 'off' || text === 'none') return null;
  const m = /^(\d+(?:\.\d+)?)(b|kb|mb|gb|tb|kib|mib|gib|tib)?$/.exec(text);
  const bytes = m ? Math.floor(Number(m[1]) * (UNITS[m[2] ?? 'b'] ?? 1)) : 0;
  if (!m || !Number.isSafeInteger(bytes) || bytes < 1)
    return 'a size such as 500GiB, 2TB or 1000000000 (bytes); off (the default) for no quota';
  return bytes;
}

/** Bytes in binary units, for messages ("12.3 GiB"). */
export function sizeText(bytes: number): string {
  const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let n = bytes;
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return i === 0 ? `${bytes} bytes` : `${n.toFixed(1)} ${units[i]}`;
}

export type BucketHeld = {
  /** The distinct blobs the mirror's present files keep in the bucket, and their bytes. */
  blobs: number;
  blobBytes: number;
  /** Bytes in the parts of multipart uploads not finished yet (downloads under way, paused, or cut off). */
  uploadBytes: number;
};

/** What the mirror holds in the bucket of `storageId`, from its rows: each sha256 once. */
export async function bucketHeld(db: Db, storageId: string): Promise<BucketHeld> {
  const [kept, parts] = await Promise.all([
    db.$queryRaw<{ blobs: bigint; bytes: bigint | null }[]>`
      SELECT count(*)::bigint AS blobs, sum(size)::bigint AS bytes FROM (
        SELECT DISTINCT ON ("actualSha256") "actualSha256", "bytesTotal" AS size FROM "MirrorFile"
        WHERE state = 'PRESENT' AND "storageId" = ${storageId} AND "actualSha256" IS NOT NULL
      ) b`,
    db.$queryRaw<{ bytes: bigint | null }[]>`SELECT sum("bytesDone")::bigint AS bytes FROM "MirrorUpload"`,
  ]);
  return {
    blobs: Number(kept[0]?.blobs ?? 0n),
    blobBytes: Number(kept[0]?.bytes ?? 0n),
    uploadBytes: Number(parts[0]?.bytes ?? 0n),
  };
}

/** The room HANGAR_S3_QUOTA leaves: the quota less the blobs and the unfinished uploads' parts; null for no quota. */
export function quotaLeft(quota: number | null, held: BucketHeld): number | null {
  return quota === null ? null : Math.max(0, quota - held.blobBytes - held.uploadBytes);
}

/** Where a refusal says the room is: the quota's setting by name, and the bucket. */
export function quotaWhere(quota: number, where: string): string {
  return `of HANGAR_S3_QUOTA (${quota} bytes, ${sizeText(quota)}) in ${where}`;
}
