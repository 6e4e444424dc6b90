import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, it } from 'vitest';

// The README's `pnpm agent` under a supervisor: the supervisor sends SIGTERM to pnpm (the process it started), and
// pnpm does not pass it on. The agent must not be left running as an orphan: it stops with its parent, saying so.
// The control plane here is a closed port: the agent starts and keeps trying, as it does while a server is away.

const ROOT = path.resolve(import.meta.dirname, '..', '..', '..');
let wrapper: ChildProcess | undefined;
let agentPid: number | undefined;
let dir: string | undefined;

afterAll(async () => {
  if (agentPid && alive(agentPid)) process.kill(agentPid, 'SIGKILL');
  if (wrapper?.exitCode === null) wrapper.kill('SIGKILL');
  if (dir) await rm(dir, { recursive: true, force: true });
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The pids whose parent is `pid` (Linux: /proc/<pid>/task/<pid>/children). */
function children(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

async function until<T>(what: string, probe: () => T | undefined | false, timeoutMs = 60_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = probe();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function killWrapper(command: string, args: string[], signal: NodeJS.Signals) {
  dir = await mkdtemp(path.join(os.tmpdir(), 'hangar-agent-parent-'));
  let output = '';
  wrapper = spawn(command, args, {
    cwd: ROOT,
    env: {
      ...process.env,
      HANGAR_URL: 'http://127.0.0.1:9',
      HANGAR_NODE_TOKEN: 'hgn_parent-exit-test',
      HANGAR_AGENT_DIR: dir,
      HANGAR_AGENT_GPUS: '[]',
      HANGAR_LOG_LEVEL: 'info',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  wrapper.stdout?.on('data', (d) => (output += String(d)));
  wrapper.stderr?.on('data', (d) => (output += String(d)));
  await until('the agent to start', () => output.includes('the Hangar agent is starting'));
  // The agent is the node process somewhere under pnpm (directly, or under a shell).
  const under = (pid: number): number[] => children(pid).flatMap((c) => [c, ...under(c)]);
  agentPid = await until('the agent process', () =>
    under(wrapper?.pid as number).find((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('hangar-agent.mjs');
      } catch {
        return false;
      }
    }),
  );

  wrapper.kill(signal);
  await until('the wrapper to exit', () => wrapper?.exitCode !== null || wrapper?.signalCode !== null);
  await until('the agent to stop with its parent', () => !alive(agentPid as number));
  // Stopped as on SIGTERM: it told the control plane it was leaving (here, that nobody answered) and stopped.
  expect(output).toMatch(/"msg":"stopping: telling the control plane this node leaves/);
  return output;
}

it('stops the agent when `pnpm agent` is sent SIGTERM, instead of leaving it orphaned', async () => {
  await killWrapper('pnpm', ['agent'], 'SIGTERM');
}, 120_000);

it('stops the agent when a wrapper that passes nothing on is killed outright', async () => {
  // A shell that waits for the agent (`; true` keeps it from exec'ing): SIGKILL gives it no chance to pass anything.
  const output = await killWrapper('sh', ['-c', 'cd packages/agent && node bin/hangar-agent.mjs; true'], 'SIGKILL');
  expect(output).toContain('"signal":"its parent process exited"');
}, 120_000);
