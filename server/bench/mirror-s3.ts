import { type ChildProcess, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { freePort } from '@hangar/common/free-port';
import { createLogger } from '@hangar/common/log';
import { createSHA256 } from 'hash-wasm';
import { loadConfig } from '../src/config.js';
import { openDatabase } from '../src/db/database.js';

// The mirror's S3 store (src/mirror/store/) against the tools an operator would otherwise use, side by side on one
// machine: fetching a large file from a local HTTP server into the bucket (Hangar's fetchIntoStore: sha256 while
// streaming, 8 MiB parts checkpointed in PostgreSQL) against `curl | tee file | openssl dgst -sha256`; serving it
// from the bucket to 1 and 16 concurrent curl clients against serving it from the `file` store. The bucket is
// s3rver in a process of its own (a JavaScript S3 server writing to the same disk): on a real S3 or MinIO the
// absolute numbers differ, the ratios say what Hangar adds on top. It also times the resumable sha256 (hash-wasm,
// whose state can be saved at each part) against Node's, the price of resuming from the last part.
//
// HANGAR_BENCH_MIRROR_S3_MB sets the file's size (default 256), HANGAR_BENCH_MIRROR_S3_ROUNDS the rounds (3; the
// median is shown with the spread). The checkpoints go to DATABASE_URL when set, else an embedded PostgreSQL.

const MIB = 1024 * 1024;
const SIZE_MB = Number(process.env.HANGAR_BENCH_MIRROR_S3_MB ?? 256);
if (!Number.isInteger(SIZE_MB) || SIZE_MB < 1 || SIZE_MB > 65536)
  throw new Error(
    `HANGAR_BENCH_MIRROR_S3_MB=${process.env.HANGAR_BENCH_MIRROR_S3_MB} is not accepted: MiB, 1 to 65536`,
  );
const ROUNDS = Number(process.env.HANGAR_BENCH_MIRROR_S3_ROUNDS ?? 3);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1 || ROUNDS > 20)
  throw new Error(
    `HANGAR_BENCH_MIRROR_S3_ROUNDS=${process.env.HANGAR_BENCH_MIRROR_S3_ROUNDS} is not accepted: 1 to 20`,
  );
const CLIENTS = 16;
const root = path.join(os.tmpdir(), `hangar-bench-mirror-s3-${process.pid}`);
const children = new Set<ChildProcess>();

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const spread = (xs: number[]) => `${Math.min(...xs).toFixed(0)}–${Math.max(...xs).toFixed(0)}`;

function run(cmd: string, args: string[]): Promise<{ code: number | null; stdout: string; ms: number }> {
  const t = performance.now();
  return new Promise((resolve, reject) => {
    const c = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let stdout = '';
    c.stdout.on('data', (d) => {
      stdout += d;
    });
    c.on('error', reject);
    c.on('close', (code) => resolve({ code, stdout, ms: performance.now() - t }));
  });
}

/** A process of its own, so its event loop is not the one measured. */
function startChild(script: string, env: Record<string, string>): ChildProcess {
  const c = spawn(process.execPath, ['--input-type=module', '-e', script], {
    cwd: path.resolve(import.meta.dirname, '..'),
    env: { ...process.env, ...env },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  children.add(c);
  return c;
}

async function waitFor(url: string) {
  for (let i = 0; i < 200; i++) {
    const ok = await fetch(url).then(
      () => true,
      () => false,
    );
    if (ok) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not answer`);
}

async function main() {
  await fs.mkdir(root, { recursive: true });
  const src = path.join(root, 'model.bin');
  // Random bytes, so nothing along the way can compress them.
  const fh = await fs.open(src, 'w');
  for (let i = 0; i < SIZE_MB; i++) await fh.write(randomBytes(MIB));
  await fh.close();
  const upPort = await freePort();
  startChild(
    `import http from 'node:http'; import fs from 'node:fs';
     http.createServer((req, res) => { const st = fs.statSync(${JSON.stringify(src)});
       res.writeHead(200, { 'content-length': st.size, 'content-type': 'application/octet-stream' });
       fs.createReadStream(${JSON.stringify(src)}, { highWaterMark: 1 << 20 }).pipe(res); }).listen(${upPort}, '127.0.0.1');`,
    {},
  );
  const s3Port = await freePort();
  startChild(
    `import S3rver from 's3rver';
     await new S3rver({ address: '127.0.0.1', port: ${s3Port}, silent: true, directory: ${JSON.stringify(path.join(root, 's3'))},
       configureBuckets: [{ name: 'bench' }] }).run();`,
    {},
  );
  const upUrl = `http://127.0.0.1:${upPort}/model.bin`;
  await Promise.all([waitFor(upUrl), waitFor(`http://127.0.0.1:${s3Port}/`)]);
  Object.assign(process.env, {
    AWS_ENDPOINT_URL: `http://127.0.0.1:${s3Port}`,
    AWS_ACCESS_KEY_ID: 'S3RVER',
    AWS_SECRET_ACCESS_KEY: 'S3RVER',
    AWS_REGION: 'us-east-1',
  });
  const { openMirrorStore, parseStoreSpec } = await import('../src/mirror/store/store.js');
  const { fetchIntoStore } = await import('../src/mirror/store/fetch-into-store.js');
  const database = await openDatabase(
    loadConfig({ DATABASE_URL: process.env.DATABASE_URL, HANGAR_DATA_DIR: path.join(root, 'data') }),
    createLogger('warn'),
  );
  const db = database.prisma;
  const s3 = await openMirrorStore({ spec: parseStoreSpec('s3://bench/mirror'), root, db, forcePathStyle: true });
  const file = await openMirrorStore({ spec: parseStoreSpec('file'), root: path.join(root, 'file-store'), db });
  const want = createHash('sha256')
    .update(await fs.readFile(src))
    .digest('hex');
  console.log(`mirror on S3: a ${SIZE_MB} MiB file, ${ROUNDS} rounds (median, spread in MB/s)`);

  // Hashing: the resumable sha256 against Node's.
  const block = randomBytes(64 * MIB);
  const hashRate = async (which: 'node' | 'wasm') => {
    const t = performance.now();
    if (which === 'node') createHash('sha256').update(block).update(block).digest('hex');
    else {
      const h = await createSHA256();
      h.init();
      h.update(block);
      h.update(block);
      h.digest('hex');
    }
    return 128 / ((performance.now() - t) / 1000);
  };
  const nodeH: number[] = [];
  const wasmH: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    nodeH.push(await hashRate('node'));
    wasmH.push(await hashRate('wasm'));
  }
  console.log(
    `sha256       node ${median(nodeH).toFixed(0)} (${spread(nodeH)})  hash-wasm ${median(wasmH).toFixed(0)} (${spread(wasmH)})  ratio ${(median(wasmH) / median(nodeH)).toFixed(2)}`,
  );

  // Fetch.
  const curl: number[] = [];
  const hangar: number[] = [];
  const hangarFile: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const out = path.join(root, `curl-${r}.bin`);
    const c = await run('sh', ['-c', `curl -sf ${upUrl} | tee ${out} | openssl dgst -sha256`]);
    if (c.code !== 0 || !c.stdout.includes(want)) throw new Error(`curl | openssl failed: ${c.stdout}`);
    curl.push(SIZE_MB / (c.ms / 1000) / 1.048576);
    await fs.rm(out);
    for (const [store, into] of [
      [s3, hangar],
      [file, hangarFile],
    ] as const) {
      const t = performance.now();
      const got = await fetchIntoStore({ store, id: `bench-${r}`, url: upUrl });
      const ms = performance.now() - t;
      if (!got.ok || got.sha256 !== want) throw new Error(`fetchIntoStore failed: ${JSON.stringify(got)}`);
      into.push(SIZE_MB / (ms / 1000) / 1.048576);
      await store.remove(want); // the next round stores it again, not "already held"
    }
  }
  // The bucket's own ceiling: the SDK's managed upload (lib-storage, 4 parts at once) of the file from the disk,
  // no fetch and no sha256. What Hangar→S3 cannot beat, whatever it does.
  const { Upload } = await import('@aws-sdk/lib-storage');
  const { createReadStream } = await import('node:fs');
  const ceiling: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const t = performance.now();
    await new Upload({
      client: (s3 as unknown as { client: import('@aws-sdk/client-s3').S3Client }).client,
      params: { Bucket: 'bench', Key: `ceiling-${r}`, Body: createReadStream(src) },
      partSize: 8 * MIB,
      queueSize: 4,
    }).done();
    ceiling.push(SIZE_MB / ((performance.now() - t) / 1000) / 1.048576);
  }
  console.log(
    `bucket       lib-storage Upload from disk ${median(ceiling).toFixed(0)} (${spread(ceiling)}): the bucket's ceiling here`,
  );
  console.log(
    `fetch        curl|tee|openssl ${median(curl).toFixed(0)} (${spread(curl)})  Hangar→S3 ${median(hangar).toFixed(0)} (${spread(hangar)})  ratio ${(median(hangar) / median(curl)).toFixed(2)}  (Hangar→file ${median(hangarFile).toFixed(0)}, ratio ${(median(hangarFile) / median(curl)).toFixed(2)})`,
  );

  // Serve: the same bytes from each store, streamed by one small server as /mirror streams them.
  await fetchIntoStore({ store: s3, id: 'bench-serve', url: upUrl });
  await fetchIntoStore({ store: file, id: 'bench-serve', url: upUrl });
  const server = http.createServer((req, res) => {
    const store = req.url?.startsWith('/s3') ? s3 : file;
    store.read(want).then(
      (body) => {
        res.writeHead(200, { 'content-length': SIZE_MB * MIB });
        pipeline(body, res).catch(() => res.destroy());
      },
      () => res.writeHead(404).end(),
    );
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  const serve = async (where: 's3' | 'file', clients: number) => {
    const t = performance.now();
    const all = await Promise.all(
      Array.from({ length: clients }, () =>
        run('curl', ['-sSf', '-o', '/dev/null', '-w', '%{size_download}', `http://127.0.0.1:${port}/${where}`]),
      ),
    );
    const bad = all.find((a) => a.code !== 0 || Number(a.stdout) !== SIZE_MB * MIB);
    if (bad) throw new Error(`serving from ${where} failed: curl exited ${bad.code} after ${bad.stdout} bytes`);
    return (clients * SIZE_MB) / ((performance.now() - t) / 1000) / 1.048576;
  };
  for (const clients of [1, CLIENTS]) {
    const f: number[] = [];
    const s: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      f.push(await serve('file', clients));
      s.push(await serve('s3', clients));
    }
    console.log(
      `serve ×${String(clients).padEnd(2)}     file store ${median(f).toFixed(0)} (${spread(f)})  S3 store ${median(s).toFixed(0)} (${spread(s)})  ratio ${(median(s) / median(f)).toFixed(2)}`,
    );
  }
  server.close();
  s3.close();
  await database.close();
}

try {
  await main();
} finally {
  for (const c of children) c.kill('SIGKILL');
  await fs.rm(root, { recursive: true, force: true });
}
