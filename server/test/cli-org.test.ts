import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// `hangar org …` as an admin runs it: bin/hangar.mjs in a process of its own against a real Hangar on a real socket,
// from an empty tree to a team with a project, members, renames and removals that say what they would do first.

const BIN = path.resolve(import.meta.dirname, '..', 'bin', 'hangar.mjs');

let t: TestApp;
let base: string;
let admin: string;
let home: string;

type Run = { code: number | null; stdout: string; stderr: string };

function hangar(args: string[]): Promise<Run> {
  const { HANGAR_URL: _u, HANGAR_TOKEN: _t, XDG_CONFIG_HOME: _x, ...inherited } = process.env;
  const proc = spawn(process.execPath, [BIN, ...args], {
    cwd: os.tmpdir(),
    env: { ...inherited, HOME: home, HANGAR_URL: base, HANGAR_TOKEN: admin },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const run: Run = { code: null, stdout: '', stderr: '' };
  proc.stdout.on('data', (d) => {
    run.stdout += String(d);
  });
  proc.stderr.on('data', (d) => {
    run.stderr += String(d);
  });
  return new Promise((resolve) =>
    proc.once('exit', (code) => {
      run.code = code;
      resolve(run);
    }),
  );
}

beforeAll(async () => {
  home = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-org-'));
  t = await startTestApp({ HOST: '127.0.0.1' });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'cli-org-admin');
}, 60_000);

afterAll(async () => {
  await t?.close();
  await fs.rm(home, { recursive: true, force: true });
});

it('builds an org, a team, a project and members, lists them, renames, and removes after saying what it would do', async () => {
  expect((await hangar(['org', 'ls'])).stdout).toContain('No organisations yet: `hangar org create NAME`');
  for (const args of [
    ['org', 'create', 'acme'],
    ['org', 'team', 'add', 'acme/support'],
    ['org', 'project', 'add', 'acme/support/tickets'],
  ]) {
    const r = await hangar(args);
    expect(r, r.stderr).toMatchObject({ code: 0 });
  }
  const user = await t.app.db.prisma.user.create({
    data: { email: 'ana@acme.test', name: 'Ana', role: 'VIEWER', passwordHash: 'x' },
  });
  const key = await t.app.db.prisma.apiToken.create({
    data: { name: 'support-bot', prefix: 'hgk_x', tokenHash: 'cli-org-bot', role: 'VIEWER', userId: user.id },
  });
  const added = await hangar(['org', 'member', 'add', 'acme/support', '--user', 'ana@acme.test']);
  expect(added).toMatchObject({ code: 0, stdout: 'user:ana@acme.test is now a member of acme/support.\n' });
  expect(await hangar(['org', 'member', 'add', 'acme/support/tickets', '--token', key.id])).toMatchObject({ code: 0 });
  const both = await hangar(['org', 'member', 'add', 'acme', '--user', 'ana@acme.test', '--token', key.id]);
  expect(both.code).toBe(2);
  expect(both.stderr).toContain('a member is --user EMAIL or --token TOKEN_ID');

  const ls = await hangar(['org', 'ls']);
  expect(ls.stdout.split('\n').map((l) => l.trimEnd())).toEqual([
    'KIND     NAME                  MEMBERS',
    'org      acme',
    'team     acme/support          user:ana@acme.test',
    `project  acme/support/tickets  key:${key.id}`,
    '',
  ]);

  // A team that owns an adapter: its removal is refused, naming what it owns.
  const team = await t.app.db.prisma.team.findFirstOrThrow({ where: { name: 'support' } });
  const model = await t.app.db.prisma.catalogModel.create({
    data: { name: 'base', source: 'http://x/m.gguf', engine: 'llamacpp', minReplicas: 0, maxReplicas: 0 },
  });
  const adapter = await t.app.db.prisma.adapter.create({
    data: { name: 'support-tone', source: 'http://x/a.gguf', owner: `team:${team.id}`, modelId: model.id },
  });
  const blocked = await hangar(['org', 'team', 'rm', 'acme/support', '--yes']);
  expect(blocked.code).toBe(5);
  expect(blocked.stderr).toContain('team acme/support still owns (delete these or give them another owner first):');
  expect(blocked.stderr).toContain('adapters: support-tone');
  expect(blocked.stderr).toContain('not removed: team acme/support still owns something');

  const renamed = await hangar(['org', 'team', 'rename', 'acme/support', 'helpdesk']);
  expect(renamed).toMatchObject({ code: 0, stdout: 'Renamed team acme/support to acme/helpdesk.\n' });
  expect(await hangar(['org', 'rename', 'acme', 'acme-corp'])).toMatchObject({ code: 0 });
  await t.app.db.prisma.adapter.delete({ where: { id: adapter.id } });

  // Without --yes: what it would do, and nothing removed.
  const preview = await hangar(['org', 'team', 'rm', 'acme-corp/helpdesk']);
  expect(preview.code).toBe(2);
  expect(preview.stderr).toContain('team acme-corp/helpdesk owns nothing.');
  expect(preview.stderr).toContain('projects removed with it: acme-corp/helpdesk/tickets');
  expect(preview.stderr).toContain('memberships that end: user:ana@acme.test at acme-corp/helpdesk');
  expect(preview.stderr).toContain('API tokens that lose this access: support-bot (ana@acme.test)');
  expect(preview.stderr).toContain('not removed: add --yes to remove team acme-corp/helpdesk');
  expect(await t.app.db.prisma.team.count()).toBe(1);

  const gone = await hangar(['org', 'member', 'rm', 'acme-corp/helpdesk', '--user', 'ana@acme.test']);
  expect(gone).toMatchObject({ code: 0, stdout: 'user:ana@acme.test is no longer a member of acme-corp/helpdesk.\n' });
  const again = await hangar(['org', 'member', 'rm', 'acme-corp/helpdesk', '--user', 'ana@acme.test']);
  expect(again.code).toBe(4);
  expect(await hangar(['org', 'project', 'rm', 'acme-corp/helpdesk/tickets', '--yes'])).toMatchObject({ code: 0 });
  expect(await hangar(['org', 'team', 'rm', 'acme-corp/helpdesk', '--yes'])).toMatchObject({ code: 0 });
  const json = await hangar(['org', 'ls', '--json']);
  expect(JSON.parse(json.stdout)).toMatchObject([{ name: 'acme-corp', teams: [], members: [] }]);
  const missing = await hangar(['org', 'rm', 'nope', '--yes']);
  expect(missing.code).toBe(4);
  expect(missing.stderr).toContain('no org nope: `hangar org ls` lists them');
}, 120_000);
