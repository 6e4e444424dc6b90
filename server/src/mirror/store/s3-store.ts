import type { Readable } from 'node:stream';
import type { S3Client } from '@aws-sdk/client-s3';
import type { IHasher } from 'hash-wasm';
import type { Db } from '../../db/client.js';
import { type BlobWrite, blobKey, inOrder, type MirrorStore, type StoreUsage } from './store.js';

// The AWS SDK and hash-wasm, loaded by loadS3Sdk() before the first S3Store: imported statically here, the server's
// bundle (scripts/build.mjs inlines this module) would load them at every start, bucket or not (test/build.test.ts).
type Sdk = {
  s3: typeof import('@aws-sdk/client-s3');
  presigner: typeof import('@aws-sdk/s3-request-presigner');
  hashWasm: typeof import('hash-wasm');
};
let loaded: Sdk | null = null;
export async function loadS3Sdk() {
  loaded ??= {
    s3: await import('@aws-sdk/client-s3'),
    presigner: await import('@aws-sdk/s3-request-presigner'),
    hashWasm: await import('hash-wasm'),
  };
}
function sdk(): Sdk {
  if (!loaded) throw new Error('the S3 store is used before loadS3Sdk()');
  return loaded;
}

// The mirror's bytes in an S3-compatible bucket, through the AWS SDK (credentials, region and endpoint from its
// standard variables: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, AWS_PROFILE…).
//
// A write is a multipart upload to uploads/<id>. Each part, once S3 has it, is checkpointed in PostgreSQL
// (MirrorUpload: the parts, the bytes they hold, and the sha256 state at their end), so a restart on any replica
// continues from the last part rather than from zero. S3 cannot read back the parts of an unfinished upload, so
// the hash state itself is kept: Node's sha256 cannot be saved, hash-wasm's can (save()/load(), 116 bytes). It
// hashes at about a sixth of Node's speed (bench/mirror-s3.ts), still faster than a single stream into a bucket.
// Once whole, the object is copied to its sha256's key (the ETag is no sha256; Hangar keeps its own) unless the
// bucket holds those bytes already, and the upload's object is deleted.

/** S3's limit for one CopyObject; larger objects are copied part by part (UploadPartCopy). */
const COPY_LIMIT = 5 * 1024 ** 3;
const COPY_PART = 1024 ** 3;
/** MirrorUpload.uploadId once S3 has completed the upload: only placing the object under its sha256 is left. */
const COMPLETED = '';
/** Parts sent at once by one write: 4 × 8 MiB held in memory at most. */
const IN_FLIGHT = 4;
const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;

type Part = { n: number; etag: string; size: number };

const notFound = (err: unknown) => {
  const e = err as { name?: string; $metadata?: { httpStatusCode?: number } };
  return e.name === 'NotFound' || e.name === 'NoSuchKey' || e.$metadata?.httpStatusCode === 404;
};

export class S3Store implements MirrorStore {
  readonly kind = 's3' as const;
  readonly where: string;
  readonly client: S3Client;
  private readonly bucket: string;
  private readonly prefix: string;
  private readonly db: Db;
  private readonly partBytes: number;

  constructor(o: {
    bucket: string;
    /** '' or ending in '/'. */
    prefix: string;
    db: Db;
    forcePathStyle: boolean;
    /** Bytes per part: 8 MiB unless set (S3 accepts 5 MiB to 5 GiB, and at most 10,000 parts). */
    partBytes?: number;
  }) {
    this.bucket = o.bucket;
    this.prefix = o.prefix;
    this.db = o.db;
    this.partBytes = o.partBytes ?? 8 * 1024 * 1024;
    this.where = `s3://${o.bucket}/${o.prefix}`;
    // Checksums only where S3 requires them: MinIO, Ceph RGW and older gateways refuse the SDK's default CRC32s.
    this.client = new (sdk().s3.S3Client)({
      forcePathStyle: o.forcePathStyle,
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    });
  }

  private key(rest: string) {
    return `${this.prefix}${rest}`;
  }

  async openWrite(id: string): Promise<BlobWrite> {
    if (!ID.test(id)) throw new Error(`not a write id: ${JSON.stringify(id)}`);
    const key = this.key(`uploads/${id}`);
    let row = await this.db.mirrorUpload.findUnique({ where: { id } });
    if (!row) {
      const created = await this.client.send(
        new (sdk().s3.CreateMultipartUploadCommand)({ Bucket: this.bucket, Key: key }),
      );
      row = await this.db.mirrorUpload.create({ data: { id, key, uploadId: created.UploadId as string } });
    }
    const hash: IHasher = await sdk().hashWasm.createSHA256();
    hash.init();
    if (row.hashState) hash.load(new Uint8Array(row.hashState));
    if (row.uploadId === COMPLETED) return this.completed(id, key, Number(row.bytesDone), hash);
    const uploadId = row.uploadId;
    const parts: Part[] = (row.parts as Part[]) ?? [];
    let offset = Number(row.bytesDone);
    let pending: Buffer[] = [];
    let pendingBytes = 0;
    // Up to IN_FLIGHT parts go to S3 while the next fills; each checkpoint waits for its part and those before it,
    // so what PostgreSQL records is always a run of parts S3 holds.
    const inFlight: Promise<void>[] = [];
    let recorded: Promise<void> = Promise.resolve();
    let failed: unknown = null;
    let final: { state: Buffer<ArrayBuffer>; sha256: string } | null = null;
    let complete = false;
    const store = this;
    const settled = async () => {
      await Promise.all(inFlight.splice(0));
      if (failed) throw failed;
    };

    const seal = async () => {
      while (inFlight.length >= IN_FLIGHT) await inFlight.shift();
      if (failed) throw failed;
      const body = Buffer.concat(pending, pendingBytes);
      pending = [];
      pendingBytes = 0;
      const n = parts.length + 1;
      // Taken now, at the part's last byte: the hash goes on with the next part's bytes while this one is sent.
      const state = Buffer.from(hash.save());
      const done = offset;
      const part = { n, etag: '', size: body.length };
      parts.push(part);
      const sent = store.client
        .send(
          new (sdk().s3.UploadPartCommand)({
            Bucket: store.bucket,
            Key: key,
            UploadId: uploadId,
            PartNumber: n,
            Body: body,
          }),
        )
        .then((r) => {
          part.etag = r.ETag as string;
        });
      // On S3 before it is recorded: a crash in between sends the part again under the same number.
      recorded = recorded
        .then(() => sent)
        .then(async () => {
          await store.db.mirrorUpload.update({
            where: { id },
            data: { parts: parts.filter((p) => p.n <= n), bytesDone: BigInt(done), hashState: state },
          });
        });
      inFlight.push(
        recorded.catch((err) => {
          failed ??= err;
        }),
      );
      sent.catch(() => {}); // reported through `recorded`
    };

    const finished = async () => {
      await settled();
      await this.db.mirrorUpload.delete({ where: { id } }).catch(() => {});
    };

    return inOrder({
      get offset() {
        return offset;
      },
      async write(chunk) {
        if (failed) throw failed;
        let at = 0;
        while (at < chunk.length) {
          const take = Math.min(chunk.length - at, store.partBytes - pendingBytes);
          const slice = chunk.subarray(at, at + take);
          hash.update(slice);
          // Copied: the caller may reuse its buffer once this resolves (http-get.ts's blocks are).
          pending.push(Buffer.from(slice));
          pendingBytes += take;
          offset += take;
          at += take;
          if (pendingBytes === store.partBytes) await seal();
        }
      },
      async finish() {
        // Asked again after a failure (the caller retries): what was done is not done twice.
        if (!final) {
          if (pendingBytes > 0 || parts.length === 0) await seal();
          await settled();
          const state = Buffer.from(hash.save());
          final = { state, sha256: hash.digest('hex') };
        }
        const { state, sha256 } = final;
        if (complete) return store.place(id, key, sha256, offset);
        await store.client.send(
          new (sdk().s3.CompleteMultipartUploadCommand)({
            Bucket: store.bucket,
            Key: key,
            UploadId: uploadId,
            MultipartUpload: { Parts: parts.map((p) => ({ PartNumber: p.n, ETag: p.etag })) },
          }),
        );
        // Whole on S3 now, and the upload is no more: recorded, so a crash before the blob is in place finishes
        // placing it rather than sending parts to an upload S3 has forgotten.
        await store.db.mirrorUpload.update({
          where: { id },
          data: { uploadId: COMPLETED, bytesDone: BigInt(offset), hashState: state },
        });
        complete = true;
        return store.place(id, key, sha256, offset);
      },
      async close() {
        // What is on S3 and recorded stays; the bytes of the part still filling come again on resume.
        await Promise.all(inFlight.splice(0));
        pending = [];
        pendingBytes = 0;
      },
      async discard() {
        await Promise.all(inFlight.splice(0));
        let refused: unknown = null;
        await store.client
          .send(new (sdk().s3.AbortMultipartUploadCommand)({ Bucket: store.bucket, Key: key, UploadId: uploadId }))
          .catch((err) => {
            if (!notFound(err)) refused = err;
          });
        failed = null;
        // The checkpoint goes whatever the bucket said: a discarded write is never continued. Parts a bucket
        // would not abort (s3rver has no AbortMultipartUpload) are left to its lifecycle rule
        // (AbortIncompleteMultipartUpload), and the caller hears why.
        await finished();
        if (refused) throw refused;
      },
    });
  }

  /** A write whose upload is complete (finish() got that far before a crash): what is left is placing it. */
  private completed(id: string, key: string, size: number, hash: IHasher): BlobWrite {
    return inOrder({
      offset: size,
      write: async () => {
        throw new Error(`the write ${id} is whole already: finish() puts it in place`);
      },
      finish: () => this.place(id, key, hash.digest('hex'), size),
      close: async () => {},
      discard: async () => {
        await this.client.send(new (sdk().s3.DeleteObjectCommand)({ Bucket: this.bucket, Key: key }));
        await this.db.mirrorUpload.delete({ where: { id } }).catch(() => {});
      },
    });
  }

  /** The whole object under its sha256's key, unless the bucket holds those bytes already; the upload's goes. */
  private async place(id: string, key: string, sha256: string, size: number) {
    const held = (await this.stat(sha256)) !== null;
    if (!held) await this.copy(key, this.key(blobKey(sha256)), size);
    await this.client.send(new (sdk().s3.DeleteObjectCommand)({ Bucket: this.bucket, Key: key }));
    await this.db.mirrorUpload.delete({ where: { id } }).catch(() => {});
    return { sha256, size, held };
  }

  /** Copies an object within the bucket, part by part past S3's 5 GiB limit for one copy. */
  private async copy(from: string, to: string, size: number) {
    const source = `${this.bucket}/${encodeURIComponent(from).replace(/%2F/g, '/')}`;
    if (size <= COPY_LIMIT) {
      await this.client.send(new (sdk().s3.CopyObjectCommand)({ Bucket: this.bucket, Key: to, CopySource: source }));
      return;
    }
    const { UploadId } = await this.client.send(
      new (sdk().s3.CreateMultipartUploadCommand)({ Bucket: this.bucket, Key: to }),
    );
    try {
      const parts: { PartNumber: number; ETag: string }[] = [];
      for (let start = 0, n = 1; start < size; start += COPY_PART, n++) {
        const end = Math.min(size, start + COPY_PART) - 1;
        const r = await this.client.send(
          new (sdk().s3.UploadPartCopyCommand)({
            Bucket: this.bucket,
            Key: to,
            UploadId,
            PartNumber: n,
            CopySource: source,
            CopySourceRange: `bytes=${start}-${end}`,
          }),
        );
        parts.push({ PartNumber: n, ETag: r.CopyPartResult?.ETag as string });
      }
      await this.client.send(
        new (sdk().s3.CompleteMultipartUploadCommand)({
          Bucket: this.bucket,
          Key: to,
          UploadId,
          MultipartUpload: { Parts: parts },
        }),
      );
    } catch (err) {
      await this.client
        .send(new (sdk().s3.AbortMultipartUploadCommand)({ Bucket: this.bucket, Key: to, UploadId }))
        .catch(() => {});
      throw err;
    }
  }

  async stat(sha256: string) {
    try {
      const head = await this.client.send(
        new (sdk().s3.HeadObjectCommand)({ Bucket: this.bucket, Key: this.key(blobKey(sha256)) }),
      );
      return { size: Number(head.ContentLength ?? 0) };
    } catch (err) {
      if (notFound(err)) return null;
      throw err;
    }
  }

  async read(sha256: string, range?: { start: number; end: number }): Promise<Readable> {
    const got = await this.client.send(
      new (sdk().s3.GetObjectCommand)({
        Bucket: this.bucket,
        Key: this.key(blobKey(sha256)),
        Range: range ? `bytes=${range.start}-${range.end}` : undefined,
      }),
    );
    return got.Body as Readable;
  }

  async remove(sha256: string) {
    await this.client.send(new (sdk().s3.DeleteObjectCommand)({ Bucket: this.bucket, Key: this.key(blobKey(sha256)) }));
  }

  /** The blobs' bytes, listed (a bucket tells no free space: freeBytes is null). */
  async usage(): Promise<StoreUsage> {
    let usedBytes = 0;
    let token: string | undefined;
    do {
      const page = await this.client.send(
        new (sdk().s3.ListObjectsV2Command)({
          Bucket: this.bucket,
          Prefix: this.key('blobs/'),
          ContinuationToken: token,
        }),
      );
      for (const o of page.Contents ?? []) usedBytes += Number(o.Size ?? 0);
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return { usedBytes, freeBytes: null };
  }

  async storageId(): Promise<string | null> {
    let text: string;
    try {
      const got = await this.client.send(
        new (sdk().s3.GetObjectCommand)({ Bucket: this.bucket, Key: this.key('.hangar-storage-id') }),
      );
      text = (await got.Body?.transformToString()) ?? '';
    } catch (err) {
      if (notFound(err)) return null;
      throw err;
    }
    const id = text.trim();
    if (!ID.test(id))
      throw new Error(
        `${this.where}.hangar-storage-id holds ${JSON.stringify(id.slice(0, 100))}, which is not a storage id: one line of letters, digits, '.', '_' and '-' (up to 100), as Hangar wrote it`,
      );
    return id;
  }

  /**
   * Written only if absent (If-None-Match: *), so of two replicas starting at once on a new bucket one id holds;
   * read back either way, for stores that ignore the condition (then the last write holds, and both read it).
   */
  async claimStorageId(): Promise<string> {
    const id = crypto.randomUUID();
    try {
      await this.client.send(
        new (sdk().s3.PutObjectCommand)({
          Bucket: this.bucket,
          Key: this.key('.hangar-storage-id'),
          Body: `${id}\n`,
          IfNoneMatch: '*',
        }),
      );
    } catch (err) {
      const status = (err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
      if (status !== 412 && status !== 409) throw err;
    }
    return (await this.storageId()) ?? id;
  }

  async presign(sha256: string, o: { seconds: number; fileName?: string }) {
    return sdk().presigner.getSignedUrl(
      this.client,
      new (sdk().s3.GetObjectCommand)({
        Bucket: this.bucket,
        Key: this.key(blobKey(sha256)),
        ResponseContentDisposition: o.fileName
          ? `attachment; filename*=UTF-8''${encodeURIComponent(o.fileName)}`
          : undefined,
      }),
      { expiresIn: o.seconds },
    );
  }

  close() {
    this.client.destroy();
  }
}
