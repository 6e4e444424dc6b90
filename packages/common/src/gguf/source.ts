import fs from 'node:fs/promises';

/** Where header bytes come from: a local file or an HTTP URL read with Range. Counts what it read. */
export interface ByteSource {
  /** The whole file's size when known (from the file system, or Content-Range). */
  size: number | null;
  bytesRead: number;
  read(offset: number, length: number): Promise<Buffer>;
  close(): Promise<void>;
}

export async function fileSource(path: string): Promise<ByteSource> {
  const fh = await fs.open(path, 'r');
  const { size } = await fh.stat();
  const src: ByteSource = {
    size,
    bytesRead: 0,
    async read(offset, length) {
      const buf = Buffer.alloc(Math.max(0, Math.min(length, size - offset)));
      const { bytesRead } = await fh.read(buf, 0, buf.length, offset);
      src.bytesRead += bytesRead;
      return buf.subarray(0, bytesRead);
    },
    close: () => fh.close(),
  };
  return src;
}

export class SourceError extends Error {}

/** Reads a remote file in pieces with `Range: bytes=a-b`; a server that ignores Range is refused, not downloaded. */
export function httpSource(
  url: string,
  headers: Record<string, string> = {},
  timeoutMs = 15_000,
  fetchImpl: typeof fetch = fetch,
): ByteSource {
  const src: ByteSource = {
    size: null,
    bytesRead: 0,
    async read(offset, length) {
      if (length <= 0) return Buffer.alloc(0);
      const res = await fetchImpl(url, {
        headers: { ...headers, range: `bytes=${offset}-${offset + length - 1}`, 'accept-encoding': 'identity' },
        signal: AbortSignal.timeout(timeoutMs),
        redirect: 'follow',
      });
      if (res.status === 416) return Buffer.alloc(0);
      if (res.status !== 206) {
        await res.body?.cancel();
        if (res.status === 200)
          throw new SourceError(
            'the server ignored the byte range: reading the header would mean downloading the whole file',
          );
        throw new SourceError(`reading the header failed: HTTP ${res.status}`);
      }
      const total = res.headers.get('content-range')?.match(/\/(\d+)$/)?.[1];
      if (total) src.size = Number(total);
      // Never more than asked for, whatever the server sends.
      const chunks: Buffer[] = [];
      let got = 0;
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        const take = Math.min(chunk.length, length - got);
        chunks.push(Buffer.from(chunk.subarray(0, take)));
        got += take;
        if (got >= length) break;
      }
      src.bytesRead += got;
      return Buffer.concat(chunks, got);
    },
    close: async () => {},
  };
  return src;
}
