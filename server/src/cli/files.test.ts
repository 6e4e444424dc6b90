import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { downloadVerified } from './files.js';

const body = Buffer.from('adapter bytes\n'.repeat(1000));
let server: http.Server;
let url: string;

beforeAll(async () => {
  server = http.createServer((_req, res) => {
    res.writeHead(200, { etag: `"${createHash('sha256').update(body).digest('hex')}"` });
    res.end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

it('downloads beside a part file a killed run left under the same pid (as a container restarts with it)', async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-files-'));
  const file = path.join(dir, 'adapter.gguf');
  await fs.writeFile(`${file}.${process.pid}.part`, 'half of an earlier run');
  const got = await downloadVerified({ url, token: 't' }, '/x', file, 'the adapter');
  expect(got.bytes).toBe(body.length);
  expect(await fs.readFile(file)).toEqual(body);
  await fs.rm(dir, { recursive: true, force: true });
});
