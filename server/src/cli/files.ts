import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { CliError, EXIT } from './exit-codes.js';

// Files to and from the server outside GraphQL: a training job's artifacts (GET /api/train/jobs/…/artifacts/…)
// and a local file into the mirror (PUT /mirror/…). Both are checked by sha256 on this side too: a download is
// kept only when its bytes hash to the sha256 the server announced (its ETag), and an upload announces the
// sha256 it hashed here (X-Content-Sha256), so the server refuses bytes that changed on the way.

type Where = { url: string; token: string };

/** Why a request did not get an answer, as one line a person can act on. */
function unreachable(base: string, err: unknown) {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  return new CliError(
    `${base} did not answer (${cause?.code ?? cause?.message ?? (err as Error).message}): is the server running, and is the address right?`,
    EXIT.unreachable,
  );
}

/** The server's refusal as the CLI's error: its JSON `error` when it sent one, the exit code by status. */
async function refusal(res: Response, what: string) {
  const text = await res.text().catch(() => '');
  let message = text.slice(0, 300);
  try {
    message = (JSON.parse(text) as { error?: string }).error ?? message;
  } catch {}
  const code =
    res.status === 401 || res.status === 403
      ? EXIT.auth
      : res.status === 404
        ? EXIT.notFound
        : res.status >= 500
          ? EXIT.unreachable
          : EXIT.failed;
  return new CliError(`${what}: ${res.status} ${message}`, code);
}

/** The file name a Content-Disposition header gives, kept to its last path part (never a path of the server's). */
function dispositionName(header: string | null) {
  const m = header?.match(/filename="([^"]+)"/);
  return m?.[1] ? path.basename(m[1]) : undefined;
}

/**
 * Downloads `urlPath` to `dest` (a file, or a directory to put the server's file name in). Written beside the
 * destination under a temporary name and renamed once its sha256 matches the ETag: an interrupted or altered
 * download never leaves a file that looks complete.
 */
export async function downloadVerified(c: Where, urlPath: string, dest: string, what: string) {
  let res: Response;
  try {
    res = await fetch(`${c.url}${urlPath}`, { headers: { authorization: `Bearer ${c.token}` } });
  } catch (err) {
    throw unreachable(c.url, err);
  }
  if (!res.ok || !res.body) throw await refusal(res, what);
  const expected = res.headers.get('etag')?.replace(/"/g, '');
  const isDir = await fs
    .stat(dest)
    .then((s) => s.isDirectory())
    .catch(() => false);
  const name = dispositionName(res.headers.get('content-disposition'));
  const file = isDir ? path.join(dest, name ?? 'artifact') : dest;
  // A name no earlier run can have left behind: a run killed mid-download leaves its part file, and in a container
  // the next run often has the same pid. 'wx' still refuses a name someone planted (a link to elsewhere).
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.part`;
  const hash = createHash('sha256');
  let bytes = 0;
  const hashing = new Transform({
    transform(chunk: Buffer, _enc, done) {
      hash.update(chunk);
      bytes += chunk.length;
      done(null, chunk);
    },
  });
  try {
    await pipeline(Readable.fromWeb(res.body as never), hashing, createWriteStream(tmp, { flags: 'wx' }));
  } catch (err) {
    await fs.rm(tmp, { force: true });
    throw new CliError(`${what}: the download broke after ${bytes} bytes (${(err as Error).message})`, EXIT.failed);
  }
  const sha256 = hash.digest('hex');
  if (expected && expected !== sha256) {
    await fs.rm(tmp, { force: true });
    throw new CliError(
      `${what}: the bytes hash to ${sha256}, the server announced ${expected}; nothing kept`,
      EXIT.failed,
    );
  }
  await fs.rename(tmp, file);
  return { file, bytes, sha256 };
}

/** The sha256 of a local file, read once before it is sent. */
export async function sha256OfFile(file: string) {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/**
 * PUTs a local file to the mirror as `model/version/name`, announcing its size and sha256: the server verifies
 * the bytes it receives against that sha256 and keeps nothing otherwise.
 */
export async function uploadToMirror(
  c: Where,
  local: string,
  target: { model: string; version: string; name: string },
) {
  let size: number;
  try {
    const st = await fs.stat(local);
    if (!st.isFile()) throw new Error('not a regular file');
    size = st.size;
  } catch (err) {
    throw new CliError(`${local} cannot be imported: ${(err as Error).message}`, EXIT.usage);
  }
  const sha256 = await sha256OfFile(local);
  const urlPath = `/mirror/${[target.model, target.version, target.name].map(encodeURIComponent).join('/')}`;
  let res: Response;
  try {
    res = await fetch(`${c.url}${urlPath}`, {
      method: 'PUT',
      headers: {
        authorization: `Bearer ${c.token}`,
        'content-type': 'application/octet-stream',
        'content-length': String(size),
        'x-content-sha256': sha256,
      },
      body: Readable.toWeb(createReadStream(local)) as ReadableStream,
      duplex: 'half',
    } as RequestInit);
  } catch (err) {
    throw unreachable(c.url, err);
  }
  if (!res.ok) throw await refusal(res, `importing ${local}`);
  const kept = (await res.json()) as { url: string | null; sha256: string; size: number };
  return { ...kept, sha256: kept.sha256 ?? sha256, size: kept.size ?? size };
}
