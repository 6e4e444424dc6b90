import { spawn } from 'node:child_process';
import type { Assignment } from './control-plane.js';

// A vLLM replica is a child process: the configured command (HANGAR_AGENT_VLLM_COMMAND, default `vllm serve`)
// with the assignment's source as its last argument and the replica in its environment. The agent keeps the
// child, reports it failed with its last output when it exits, and ends it (and what it started) on stop.

export type ServingProcess = {
  pid: number;
  /** Resolves when the child exits, with its last lines of output. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; tail: string }>;
  stop(): Promise<void>;
};

export async function startServing(command: string[], a: Assignment): Promise<ServingProcess> {
  const [program, ...args] = command;
  if (!program) throw new Error('no command to run');
  const child = spawn(program, [...args, a.source], {
    // The child inherits the agent's environment (CUDA_VISIBLE_DEVICES, HF_HOME and the like) plus the replica.
    env: {
      ...process.env,
      HANGAR_REPLICA_ID: a.replicaId,
      HANGAR_MODEL: a.model,
      HANGAR_MODEL_SOURCE: a.source,
      HANGAR_CONTEXT_SIZE: a.contextSize == null ? '' : String(a.contextSize),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    // Its own process group, so stopping it also stops the workers vLLM starts.
    detached: true,
  });
  const lines: string[] = [];
  const keep = (b: Buffer) => {
    for (const l of b.toString('utf8').split(/\r?\n/)) if (l.trim()) lines.push(l.trim());
    if (lines.length > 20) lines.splice(0, lines.length - 20);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; tail: string }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal, tail: lines.slice(-5).join(' | ') })),
  );
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', (err) => reject(new Error(`${program} could not be started: ${err.message}`)));
  });
  const pid = child.pid as number;
  let stopping: Promise<void> | undefined;
  const signalGroup = (sig: NodeJS.Signals) => {
    try {
      process.kill(-pid, sig);
    } catch {
      // Already gone.
    }
  };
  return {
    pid,
    exited,
    stop: () => {
      stopping ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        signalGroup('SIGTERM');
        // vLLM frees GPU memory on SIGTERM within seconds; one that hangs is killed so the GPU is not held.
        const killer = setTimeout(() => signalGroup('SIGKILL'), 15_000);
        await exited;
        clearTimeout(killer);
      })();
      return stopping;
    },
  };
}
