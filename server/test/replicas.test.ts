import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MirrorStorageError } from '../src/mirror/storage.js';
import { ADMIN_EMAIL, ADMIN_PASSWORD, startTestApp, type TestApp } from './harness.js';

// Three replicas on one database, as docs/security.md promises: one on the same data dir (the shared storage)
// starts and serves the files; one on another data dir, and one whose storage is not mounted, refuse to start,
// saying why, and leave every file as it was. Before storages had ids, each of the last two marked every
// present file FAILED ("removed by hand?").

const SERVER_DIR = path.resolve(import.meta.dirname, '..');

let t: TestApp;
let base: string;
let token: string;
const dirs: string[] = [];
const body = Buffer.from('GGUF and then some bytes of a model\n'.repeat(200));

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  token = await t.token('OPERATOR');
  for (const file of ['a.gguf', 'b.gguf']) {
    const res = await fetch(`${base}/mirror/shared/v1/${file}`, {
      method: 'PUT',
      headers: {
        authorization: `Bearer ${token}`,
        'content-length': String(body.length),
        'x-content-sha256': createHash('sha256').update(body).digest('hex'),
      },
      body,
    });
    expect(res.status).toBe(201);
  }
});
afterAll(async () => {
  await t.close();
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
});

const files = () =>
  t.app.db.prisma.mirrorFile.findMany({
    orderBy: { file: 'asc' },
    select: { file: true, state: true, error: true, bytesDone: true, storageId: true, updatedAt: true },
  });
const storageId = async (dataDir: string) =>
  (await fs.readFile(path.join(dataDir, 'mirror', '.hangar-storage-id'), 'utf8')).trim();
const tempDir = async () => {
  const d = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-replica-'));
  dirs.push(d);
  return d;
};
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => {
      throw new Error('the replica started');
    },
    (err: unknown) => err as Error,
  );

describe('replicas sharing one database', () => {
  it('records the storage on each file, and a replica on the same data dir starts and serves them', async () => {
    const id = await storageId(t.dataDir);
    const rows = await files();
    expect(rows.map((r) => [r.file, r.state, r.storageId])).toEqual([
      ['a.gguf', 'PRESENT', id],
      ['b.gguf', 'PRESENT', id],
    ]);
    const second = await t.replica();
    const url = await second.start();
    const got = await fetch(`${url}/mirror/shared/v1/b.gguf`, { headers: { authorization: `Bearer ${token}` } });
    expect(got.status).toBe(200);
    expect(Buffer.from(await got.arrayBuffer()).equals(body)).toBe(true);
    expect(await files()).toEqual(rows);
    await second.stop();
  });

  it('refuses to start a replica on another data dir, naming both, and changes no file', async () => {
    const before = await files();
    const other = await tempDir();
    const err = await refusal(t.replica({ HANGAR_DATA_DIR: other }));
    expect(err).toBeInstanceOf(MirrorStorageError);
    const id = await storageId(t.dataDir);
    expect(err.message).toContain(`the database's mirror is on storage ${id} (2 files)`);
    expect(err.message).toContain(`HANGAR_DATA_DIR=${other}`);
    expect(err.message).toMatch(/seems missing/);
    expect(await files()).toEqual(before);
    // Nothing written on the storage it refused, either: it may be an unmounted mount point.
    expect(await fs.readdir(other)).toEqual([]);
  });

  it('refuses a data dir that is storage of its own (it has an id), naming both ids', async () => {
    const before = await files();
    const other = await tempDir();
    await fs.mkdir(path.join(other, 'mirror'));
    await fs.writeFile(path.join(other, 'mirror', '.hangar-storage-id'), 'storage-of-its-own\n');
    const err = await refusal(t.replica({ HANGAR_DATA_DIR: other }));
    expect(err).toBeInstanceOf(MirrorStorageError);
    expect(err.message).toContain(
      `this replica's mirror storage is storage-of-its-own at ${path.join(other, 'mirror')}`,
    );
    expect(err.message).toContain(`holds files on storage ${await storageId(t.dataDir)} (2 files)`);
    expect(await files()).toEqual(before);
  });

  it('refuses to start when the storage is not mounted, fails no file, and starts once it is back', async () => {
    const before = await files();
    const mirror = path.join(t.dataDir, 'mirror');
    const away = `${mirror}.unmounted`;
    // What an absent mount looks like: the mount point is there, empty.
    await fs.rename(mirror, away);
    await fs.mkdir(mirror);
    const err = await refusal(t.restart());
    expect(err).toBeInstanceOf(MirrorStorageError);
    expect(err.message).toMatch(/the mirror's storage seems missing/);
    expect((await files()).filter((f) => f.state !== 'PRESENT')).toEqual([]);
    expect(await files()).toEqual(before);

    await fs.rm(mirror, { recursive: true });
    await fs.rename(away, mirror);
    base = await (await t.restart()).start();
    expect((await files()).map((f) => f.state)).toEqual(['PRESENT', 'PRESENT']);
  });

  it('takes files recorded before storages had ids as on the first storage that starts with them', async () => {
    await t.app.db.prisma.mirrorFile.updateMany({ data: { storageId: null } });
    base = await (await t.restart()).start();
    const id = await storageId(t.dataDir);
    expect((await files()).map((f) => [f.state, f.storageId])).toEqual([
      ['PRESENT', id],
      ['PRESENT', id],
    ]);
  });

  it('still fails a file of its own storage that was removed by hand', async () => {
    await fs.rm(path.join(t.dataDir, 'mirror', 'files', 'shared', 'v1', 'b.gguf'));
    base = await (await t.restart()).start();
    const rows = await files();
    expect(rows.map((f) => f.state)).toEqual(['PRESENT', 'FAILED']);
    expect(rows[1]?.error).toMatch(/no longer on disk/);
  });

  it('prints why at the default log level when the server process refuses', async () => {
    const other = await tempDir();
    const proc = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
      cwd: SERVER_DIR,
      env: {
        ...process.env,
        DATABASE_URL: t.app.db.url,
        HANGAR_DATA_DIR: other,
        HANGAR_WEB_DIST: path.join(other, 'no-web-dist'),
        PORT: '0',
        HANGAR_ADMIN_EMAIL: ADMIN_EMAIL,
        HANGAR_ADMIN_PASSWORD: ADMIN_PASSWORD,
        HANGAR_LOG_LEVEL: '',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    proc.stdout.on('data', (d) => {
      output += d;
    });
    proc.stderr.on('data', (d) => {
      output += d;
    });
    // A server that does not refuse would run on: stopped here so the test fails rather than hangs.
    const timer = setTimeout(() => proc.kill('SIGKILL'), 30_000);
    const code = await new Promise<number | null>((resolve) => proc.once('exit', resolve));
    clearTimeout(timer);
    expect(code).toBe(2);
    expect(output).toContain("Hangar cannot start: the mirror's storage seems missing");
    expect(output).toContain(`HANGAR_DATA_DIR=${other}`);
    expect(output).toContain(await storageId(t.dataDir));
  }, 60_000);
});
