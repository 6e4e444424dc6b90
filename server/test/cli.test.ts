import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { freePort } from '@hangar/common/free-port';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { modelHeader } from '@hangar/common/test/fixtures/gguf-writer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { ADMIN_EMAIL, ADMIN_PASSWORD, startTestApp, type TestApp } from './harness.js';

// The `hangar` CLI as a user runs it: bin/hangar.mjs in a process of its own, against a real Hangar on a real
// socket (its database, its mirror), with the Hub, the file upstream and a node's replica stood in for.

const SERVER_DIR = path.resolve(import.meta.dirname, '..');
const BIN = path.join(SERVER_DIR, 'bin', 'hangar.mjs');

let t: TestApp;
let base: string;
let up: Upstream;
let hub: FakeHub;
let endpoint: StandInReplica;
let operator: string;
let home: string;
let agent: NodeJS.Timeout;
const KEY = 'hgk_cli-test-engine-key-0123456789abcdefghij';

type Run = { code: number | null; stdout: string; stderr: string };

/** Starts `hangar …args`; HOME is a directory of the test's, so `login` writes there and nowhere else. */
function start(args: string[], env: Record<string, string> = {}, input?: string) {
  const { HANGAR_URL: _u, HANGAR_TOKEN: _t, XDG_CONFIG_HOME: _x, ...inherited } = process.env;
  const proc = spawn(process.execPath, [BIN, ...args], {
    cwd: os.tmpdir(),
    env: { ...inherited, HOME: home, ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const run: Run & { proc: ChildProcess; done: Promise<Run> } = {
    code: null,
    stdout: '',
    stderr: '',
    proc,
    done: undefined as unknown as Promise<Run>,
  };
  proc.stdout.on('data', (d) => {
    run.stdout += String(d);
  });
  proc.stderr.on('data', (d) => {
    run.stderr += String(d);
  });
  proc.stdin.end(input ?? '');
  run.done = new Promise((resolve) =>
    proc.once('exit', (code) => {
      run.code = code;
      resolve(run);
    }),
  );
  return run;
}

const hangar = (args: string[], env: Record<string, string> = {}, input?: string) => start(args, env, input).done;
const asOperator = () => ({ HANGAR_URL: base, HANGAR_TOKEN: operator });

async function until<T>(what: string, probe: () => T | Promise<T>, timeoutMs = 30_000): Promise<NonNullable<T>> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v) return v as NonNullable<T>;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const VERSION = `query($m: String!, $v: String!) { mirrorVersion(model: $m, version: $v) { state bytesDone bytesTotal } }`;

beforeAll(async () => {
  home = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-home-'));
  up = await startUpstream();
  endpoint = await startStandInReplica({ key: KEY });
  hub = await startFakeHub();
  const tiny = modelHeader({ arch: 'llama', layers: 2, embd: 64, heads: 4, kvHeads: 4, ctx: 2048, tensorType: 0 });
  hub.repos.set('acme/Tiny-GGUF', {
    id: 'acme/Tiny-GGUF',
    sha: 'feedbeef11111111111111111111111111111111',
    tags: ['gguf'],
    files: [{ path: 'Tiny-Q4_K_M.gguf', head: tiny.header, size: tiny.size, lfs: true }],
  });
  // A repository whose only set is unquantised: `hangar serve` with no --quant must take it, not ask for Q4_K_M.
  hub.repos.set('acme/Wide-GGUF', {
    id: 'acme/Wide-GGUF',
    sha: 'f32f32f3222222222222222222222222222222222',
    tags: ['gguf'],
    files: [{ path: 'Wide-F32.gguf', head: tiny.header, size: tiny.size, lfs: true }],
  });
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HOST: '127.0.0.1' });
  base = await t.app.start();
  operator = await t.token('OPERATOR', 'cli-ops');
  const admin = await t.token('ADMIN', 'cli-admin');
  const nodeToken = (
    await t.gql('mutation { createNode(name: "gpu-1") { ... on CreatedNode { token } } }', {}, { token: admin })
  ).data?.createNode.token;
  // A node agent played over GraphQL, as serve-job.test.ts does: reports a GPU and answers each assignment READY
  // with the stand-in replica's endpoint.
  const tick = async () => {
    await t.gql(
      'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename } }',
      {
        i: {
          gpus: [{ index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 }],
          engines: [{ name: 'llama.cpp', build: 6000 }],
        },
      },
      { token: nodeToken },
    );
    const assigned =
      (await t.gql('{ nodeAssignments { replicaId desired } }', {}, { token: nodeToken })).data?.nodeAssignments ?? [];
    for (const a of assigned) {
      const i =
        a.desired === 'RUN'
          ? { replicaId: a.replicaId, state: 'READY', endpoint: endpoint.endpoint, engineKey: KEY }
          : { replicaId: a.replicaId, state: 'STOPPED' };
      await t.gql(
        'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename } }',
        { i },
        { token: nodeToken },
      );
    }
  };
  await tick();
  agent = setInterval(() => void tick().catch(() => {}), 300);
}, 60_000);

afterAll(async () => {
  clearInterval(agent);
  await t?.close();
  await up?.close();
  await hub?.close();
  await endpoint?.close();
  await fs.rm(home, { recursive: true, force: true });
});

describe('hangar login', () => {
  it('signs in with a password, keeps a token in a 0600 file, and the next command uses it', async () => {
    const r = await hangar(['login', base, '--email', ADMIN_EMAIL, '--password-stdin'], {}, `${ADMIN_PASSWORD}\n`);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const file = path.join(home, '.config', 'hangar', 'credentials.json');
    expect(r.stdout).toContain(`signed in to ${base} as ${ADMIN_EMAIL} (admin); token kept in ${file}`);
    const stat = await fs.stat(file);
    expect(stat.mode & 0o777).toBe(0o600);
    const kept = JSON.parse(await fs.readFile(file, 'utf8'));
    expect(kept.url).toBe(base);
    expect(kept.token).toMatch(/^\S{20,}$/);
    // No HANGAR_URL or HANGAR_TOKEN: the stored ones.
    const ls = await hangar(['--json', 'models']);
    expect(ls.stderr).toBe('');
    expect(ls.code).toBe(0);
    expect(JSON.parse(ls.stdout)).toEqual([]);
  }, 60_000);

  it('refuses a wrong password with exit 3 and keeps nothing new', async () => {
    const other = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-home2-'));
    const r = await hangar(['login', base, '--email', ADMIN_EMAIL, '--password-stdin'], { HOME: other }, 'wrong\n');
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/^hangar: .+/);
    await expect(fs.stat(path.join(other, '.config', 'hangar', 'credentials.json'))).rejects.toThrow(/ENOENT/);
    await fs.rm(other, { recursive: true, force: true });
  }, 60_000);

  it('keeps a token given with --token once the server knows it, and refuses a wrong one with exit 3', async () => {
    const other = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-home3-'));
    const ok = await hangar(['login', base.replace('http://', ''), '--token', operator], { HOME: other });
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/^signed in to http:\/\/127\.0\.0\.1:\d+ as admin@example\.com \(operator\)/);
    const wrong = await hangar(['login', base, '--token', 'hgr_not-a-token-this-server-made'], { HOME: other });
    expect(wrong.code).toBe(3);
    expect(wrong.stderr).toMatch(/^hangar: .*hangar login|^hangar: .*does not know that token/);
    // The good token is still what is kept.
    const kept = JSON.parse(await fs.readFile(path.join(other, '.config', 'hangar', 'credentials.json'), 'utf8'));
    expect(kept.token).toBe(operator);
    await fs.rm(other, { recursive: true, force: true });
  }, 60_000);

  it('says how to sign in, with exit 3, when there is no token', async () => {
    const r = await hangar(['mirror', 'ls'], { HOME: path.join(home, 'nobody') });
    expect(r.code).toBe(3);
    expect(r.stderr).toBe('hangar: not signed in: run `hangar login URL` (or set HANGAR_URL and HANGAR_TOKEN)\n');
  }, 60_000);

  it('says the server did not answer, or was not Hangar, with exit 6 (the client the agent uses too)', async () => {
    const url = `http://127.0.0.1:${await freePort()}`;
    const none = await hangar(['mirror', 'ls'], { HANGAR_URL: url, HANGAR_TOKEN: 'hgr_nothing-listens' });
    expect(none.code).toBe(6);
    expect(none.stderr).toBe(
      `hangar: ${url} did not answer (ECONNREFUSED): is the server running, and is the address right?\n`,
    );
    // A proxy in front of a server that is down: its error page, not GraphQL.
    const proxy = http.createServer((_req, res) =>
      res.writeHead(502, { 'content-type': 'text/html' }).end('<h1>502</h1>'),
    );
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    try {
      const at = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
      const page = await hangar(['mirror', 'ls'], { HANGAR_URL: at, HANGAR_TOKEN: 'hgr_behind-a-proxy' });
      expect(page.code).toBe(6);
      expect(page.stderr).toBe(`hangar: ${at} answered 502 <h1>502</h1>: is this a Hangar server?\n`);
    } finally {
      await new Promise((r) => proxy.close(r));
    }
  }, 60_000);
});

describe('hangar mirror', () => {
  it('pulls two shards with one progress bar summed over both, then lists the version with --json', async () => {
    const a = bytes(300_000, 41);
    const b = bytes(200_000, 42);
    up.files.set('shard-00001-of-00002.gguf', { body: a, fault: { kind: 'drip', chunk: 25_000, everyMs: 100 } });
    up.files.set('shard-00002-of-00002.gguf', { body: b, fault: { kind: 'drip', chunk: 25_000, everyMs: 100 } });
    const r = await hangar(
      [
        'mirror',
        'pull',
        up.url('shard-00001-of-00002.gguf'),
        up.url('shard-00002-of-00002.gguf'),
        '--version',
        'v1',
        '--fetch-anyway',
      ],
      asOperator(),
    );
    expect(r.code, r.stderr).toBe(0);
    // The model is named from the files, without the shard numbering; the bar's total is both files together.
    expect(r.stderr).toMatch(/shard\/v1 +\[[█░]+\] +100% +488\.3 KiB of 488\.3 KiB/);
    expect(r.stdout).toBe('shard/v1: present, 488.3 KiB, verified\n');

    const ls = await hangar(['mirror', 'ls', '--json'], asOperator());
    expect(ls.code).toBe(0);
    const versions = JSON.parse(ls.stdout);
    expect(versions).toEqual([
      expect.objectContaining({
        model: 'shard',
        version: 'v1',
        state: 'PRESENT',
        bytesDone: 500_000,
        bytesTotal: 500_000,
        fileCount: 2,
        verified: true,
      }),
    ]);
    const table = await hangar(['mirror', 'ls'], asOperator());
    expect(table.stdout.split('\n')[1]).toMatch(/^shard +v1 +present +488\.3 KiB +2 +yes$/);
  }, 90_000);

  it('refuses a URL the mirror will not fetch with exit 2, naming the field, and starts nothing', async () => {
    const r = await hangar(['mirror', 'pull', 'ftp://files.example/x.gguf', '--version', 'v1'], asOperator());
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(/^hangar: .*(url|URL).*\n$/);
    expect((await t.gql(VERSION, { m: 'x', v: 'v1' }, { token: operator })).data?.mirrorVersion).toBeNull();
    const junk = await hangar(['mirror', 'pull', 'not a url'], asOperator());
    expect(junk.code).toBe(2);
    expect(junk.stderr).toBe(`hangar: "not a url" is not a URL: give the file's http(s):// address\n`);
  }, 60_000);

  it('Ctrl-C stops watching, says how to watch again, and leaves the download going', async () => {
    up.files.set('slow.gguf', { body: bytes(2_000_000, 43), fault: { kind: 'drip', chunk: 10_000, everyMs: 100 } });
    const run = start(['mirror', 'pull', up.url('slow.gguf'), '--version', 'v1', '--fetch-anyway'], asOperator());
    // Once the server has it and bytes are moving, the terminal goes away.
    await until('the download to start', async () => {
      const v = (await t.gql(VERSION, { m: 'slow', v: 'v1' }, { token: operator })).data?.mirrorVersion;
      return v && v.bytesDone > 0 && run.stderr.includes('slow/v1');
    });
    run.proc.kill('SIGINT');
    const r = await run.done;
    expect(r.code).toBe(130);
    expect(r.stderr).toContain(
      'Stopped watching; the download goes on in the server. Watch it again: hangar mirror watch slow v1\n',
    );
    const then = (await t.gql(VERSION, { m: 'slow', v: 'v1' }, { token: operator })).data?.mirrorVersion;
    expect(then.state).toBe('FETCHING');
    await until('more bytes after the CLI left', async () => {
      const v = (await t.gql(VERSION, { m: 'slow', v: 'v1' }, { token: operator })).data?.mirrorVersion;
      return v.bytesDone > then.bytesDone;
    });
    // And it can be watched again to the end, as the message said.
    const again = await hangar(['mirror', 'watch', 'slow', 'v1', '--json'], asOperator());
    expect(again.code, again.stderr).toBe(0);
    const lines = again.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines.at(-1)).toMatchObject({ model: 'slow', version: 'v1', state: 'PRESENT', bytesDone: 2_000_000 });
  }, 120_000);
});

describe('hangar mirror import', () => {
  it('puts a local file into the mirror, verified by its sha256, and serves it back byte for byte', async () => {
    const file = path.join(home, 'my-model.gguf');
    const content = Buffer.from(Array.from({ length: 300_000 }, (_, i) => (i * 7) % 251));
    await fs.writeFile(file, content);
    const r = await hangar(
      ['--json', 'mirror', 'import', file, '--model', 'imported', '--version', 'v1'],
      asOperator(),
    );
    expect(r.code, r.stderr).toBe(0);
    const kept = JSON.parse(r.stdout) as { url: string; sha256: string; size: number };
    expect(kept.size).toBe(content.length);
    const served = Buffer.from(
      await (
        await fetch(`${base}/mirror/imported/v1/my-model.gguf`, {
          headers: { authorization: `Bearer ${operator}` },
        })
      ).arrayBuffer(),
    );
    expect(Buffer.compare(served, content)).toBe(0);
    expect(kept.url).toContain('/mirror/imported/v1/my-model.gguf');
  }, 60_000);

  it('refuses a file that is not there with exit 2, sending nothing', async () => {
    const r = await hangar(
      ['mirror', 'import', path.join(home, 'absent.gguf'), '--model', 'imported', '--version', 'v2'],
      asOperator(),
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^hangar: .*absent\.gguf cannot be imported: ENOENT/);
    const v = await t.gql(VERSION, { m: 'imported', v: 'v2' }, { token: operator });
    expect(v.data?.mirrorVersion).toBeNull();
  }, 60_000);
});

describe('hangar mirror rm', () => {
  it('removes a version, and says not found (exit 4) the second time', async () => {
    const r = await hangar(['mirror', 'rm', 'slow', 'v1'], asOperator());
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe('removed slow/v1: 1 files, 1.91 MiB\n');
    expect((await t.gql(VERSION, { m: 'slow', v: 'v1' }, { token: operator })).data?.mirrorVersion).toBeNull();
    const again = await hangar(['--json', 'mirror', 'rm', 'slow', 'v1'], asOperator());
    expect(again.code).toBe(4);
    expect(JSON.parse(again.stdout)).toMatchObject({ error: { code: 'NOT_FOUND' } });
  }, 60_000);
});

describe('hangar serve', () => {
  it('prints each step as it changes, from the subscription, and exits 0 when the job is done', async () => {
    const r = await hangar(['serve', 'acme/Tiny-GGUF', '--quant', 'Q4_K_M'], asOperator());
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    // Each step's last line says done, in the job's order; earlier lines are the same step as it moved.
    const lastOf = (step: string) => lines.filter((l) => l.startsWith(`${step.padEnd(8)} `)).at(-1);
    expect(lastOf('registry')).toMatch(
      /^registry done: model:Tiny-Q4_K_M: 1 file\(s\), [\d.]+ (bytes|KiB|MiB) at feedbee$/,
    );
    expect(lastOf('mirror')).toBe('mirror   done: tiny/feedbee-q4_k_m present and verified');
    expect(lastOf('replica')).toBe('replica  done: ready on gpu-1');
    expect(lastOf('smoke')).toMatch(/^smoke +done/);
    const order = ['registry', 'mirror', 'check', 'catalog', 'replica', 'smoke'].map((s) =>
      lines.findIndex((l) => l.startsWith(`${s.padEnd(8)} done`)),
    );
    expect(order.every((i) => i >= 0)).toBe(true);
    expect([...order].sort((x, y) => x - y)).toEqual(order);
    expect(r.stderr).toMatch(/^serve job \S+ started for acme\/Tiny-GGUF \(Q4_K_M\)\n/);
    expect(r.stderr).toMatch(/done: answered " Hello there!"/);
  }, 120_000);

  it('exits 1 with the reason when the job fails', async () => {
    const r = await hangar(['serve', 'acme/Tiny-GGUF', '--quant', 'Q8_0'], asOperator());
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('serve job failed: registry: acme/Tiny-GGUF has no Q8_0 set; it has Q4_K_M');
  }, 60_000);

  it('with no --quant takes the best set the repository has (its only one, F32 here) and says which', async () => {
    const r = await hangar(['serve', 'acme/Wide-GGUF', '--no-wait'], asOperator());
    expect(r.code, r.stderr).toBe(0);
    const id = r.stdout.trim();
    const step = await until('the registry step to end', async () => {
      const job = (
        await t.gql(
          'query($id: ID!) { serveJob(id: $id) { steps { name state message } } }',
          { id },
          { token: operator },
        )
      ).data?.serveJob;
      const registry = job?.steps.find((s: { name: string }) => s.name === 'registry');
      return registry && registry.state !== 'QUEUED' && registry.state !== 'RUNNING' ? registry : undefined;
    });
    expect(step).toMatchObject({ state: 'DONE' });
    expect(step.message).toMatch(
      /^no quantisation asked: took F32, the first by preference that fits on a node now: model:Wide-F32/,
    );
    // The job goes on to smoke-test its replica on the same stand-in endpoint the chat tests below read: let it
    // end first, so its request is not taken for theirs.
    await until(
      'the serve job to end',
      async () => {
        const job = (await t.gql('query($id: ID!) { serveJob(id: $id) { state } }', { id }, { token: operator })).data
          ?.serveJob;
        return job && ['DONE', 'FAILED', 'CANCELLED'].includes(job.state);
      },
      60_000,
    );
  }, 120_000);

  it('answers every line piped to `hangar chat`, keeping the conversation', async () => {
    const r = await hangar(['chat', 'tiny'], asOperator(), 'first question\nsecond question\nthird question\n');
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(' Hello there!\n Hello there!\n Hello there!\n');
    expect(endpoint.requests.at(-1)?.body.messages).toEqual([
      { role: 'user', content: 'first question' },
      { role: 'assistant', content: ' Hello there!' },
      { role: 'user', content: 'second question' },
      { role: 'assistant', content: ' Hello there!' },
      { role: 'user', content: 'third question' },
    ]);
  }, 60_000);

  it('drops the oldest exchange when the conversation outgrows the context, says so, and goes on', async () => {
    // 60 characters hold one question and its answer, not two questions: the third line must drop the first.
    endpoint.contextChars = 60;
    try {
      const line = (c: string) => c.repeat(25);
      const r = await hangar(['chat', 'tiny'], asOperator(), `${line('a')}\n${line('b')}\n`);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toBe(' Hello there!\n Hello there!\n');
      expect(r.stderr).toContain("the conversation no longer fits tiny's context: dropped the oldest exchange");
      expect(endpoint.requests.at(-1)?.body.messages).toEqual([{ role: 'user', content: line('b') }]);
      // One question alone over the context cannot be helped by dropping: it is refused, exit 1, said as is.
      const alone = await hangar(['chat', 'tiny'], asOperator(), `${'c'.repeat(61)}\n`);
      expect(alone.code).toBe(1);
      expect(alone.stderr).toContain('maximum context length is 60');
    } finally {
      endpoint.contextChars = undefined;
    }
  }, 60_000);

  it('chats with the served model through the gateway, streaming', async () => {
    const r = await hangar(['chat', 'tiny', 'say', 'hello'], asOperator());
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(' Hello there!\n');
    expect(endpoint.requests.at(-1)?.body.messages).toEqual([{ role: 'user', content: 'say hello' }]);
  }, 60_000);
});

describe('the read commands', () => {
  it('search and show the registry, list nodes, models and training jobs', async () => {
    const search = await hangar(['registry', 'search', 'tiny', '--json'], asOperator());
    expect(search.code, search.stderr).toBe(0);
    expect(JSON.parse(search.stdout)).toEqual([expect.objectContaining({ id: 'acme/Tiny-GGUF', hasGguf: true })]);
    const show = await hangar(['registry', 'show', 'acme/Tiny-GGUF'], asOperator());
    expect(show.code, show.stderr).toBe(0);
    expect(show.stdout).toMatch(/^acme\/Tiny-GGUF @ feedbee/);
    expect(show.stdout).toMatch(/\nfeedbee-q4_k_m +Q4_K_M +[\d.]+ KiB +1 +yes/);
    const missing = await hangar(['registry', 'show', 'acme/Nothing-Here'], asOperator());
    expect(missing.code, missing.stderr).toBe(4);
    const nodes = await hangar(['--json', 'nodes'], asOperator());
    expect(JSON.parse(nodes.stdout)).toEqual([
      expect.objectContaining({ name: 'gpu-1', online: true, gpus: [expect.objectContaining({ name: 'RTX 4090' })] }),
    ]);
    const jobs = await hangar(['train', 'ls', '--json'], asOperator());
    expect(jobs.code, jobs.stderr).toBe(0);
    expect(JSON.parse(jobs.stdout)).toEqual([]);
    const bad = await hangar(['train', 'ls', '--state', 'sleeping'], asOperator());
    expect(bad.code).toBe(2);
    expect(bad.stderr).toBe('hangar: --state is one of QUEUED, RUNNING, DONE, FAILED, CANCELLED: "sleeping" is not\n');
  }, 90_000);
});
