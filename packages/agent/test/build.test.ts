import { spawn } from 'node:child_process';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildAgent, distDir } from '../scripts/build.mjs';

// What an image runs (Dockerfile.agent ships dist/ without the sources): the bundle must load on its own, with
// @hangar/common inside it and the files it reaches beside it (the hashing worker, the trainer) found.

let dataDir: string;
beforeAll(async () => {
  await buildAgent();
  dataDir = await mkdtemp(path.join(os.tmpdir(), 'hangar-agent-build-'));
}, 60_000);
afterAll(() => rm(dataDir, { recursive: true, force: true }));

function run(env: Record<string, string>) {
  const child = spawn(process.execPath, ['--enable-source-maps', path.join(distDir, 'agent.js')], {
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (c) => (stderr += c));
  return new Promise<{ code: number | null; stderr: string }>((resolve) =>
    child.on('exit', (code) => resolve({ code, stderr })),
  );
}

describe("the agent's bundle", () => {
  it('loads and refuses a missing setting in its own words', async () => {
    await expect(stat(path.join(distDir, 'agent.js.map'))).resolves.toBeTruthy();
    const ended = await run({ HANGAR_AGENT_DIR: dataDir });
    expect(ended.code).toBe(2);
    expect(ended.stderr).toMatch(/HANGAR_/);
    expect(ended.stderr).not.toMatch(/ERR_MODULE_NOT_FOUND|ERR_UNKNOWN_FILE_EXTENSION|Cannot find/);
  });
});
