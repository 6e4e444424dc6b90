import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { AgentGpu } from './config.js';

// What a node reports with each heartbeat: its GPUs, the engines it can run, and the disk left for models.
// The control plane places replicas from this, so each value says where it came from when it is not measured.

export type EngineReport = { name: string; version: string | null; build: number | null };

export const GPU_QUERY = ['--query-gpu=index,name,memory.total,memory.free', '--format=csv,noheader,nounits'];

/**
 * Parses `nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader,nounits`. A name may
 * itself hold a comma, so the index is the first field and the two sizes are the last two. A size nvidia-smi
 * cannot read ("[N/A]", on some MIG and unified-memory parts) is reported as 0 rather than dropping the GPU.
 */
export function parseNvidiaSmi(output: string): AgentGpu[] {
  const gpus: AgentGpu[] = [];
  for (const line of output.split(/\r?\n/)) {
    if (!line.trim()) continue;
    const fields = line.split(',').map((f) => f.trim());
    if (fields.length < 4) throw new Error(`nvidia-smi printed a line this agent does not understand: ${line.trim()}`);
    const index = Number(fields[0]);
    if (!Number.isInteger(index) || index < 0) throw new Error(`nvidia-smi printed a GPU index of "${fields[0]}"`);
    const mib = (s: string | undefined) => {
      const n = Number(s);
      return Number.isFinite(n) && n >= 0 ? Math.round(n) : 0;
    };
    gpus.push({
      index,
      name: fields.slice(1, -2).join(', '),
      totalMiB: mib(fields.at(-2)),
      freeMiB: mib(fields.at(-1)),
    });
  }
  return gpus;
}

type Exec = (file: string, args: string[]) => Promise<string>;

const execText: Exec = (file, args) =>
  new Promise((resolve, reject) =>
    execFile(file, args, { timeout: 10_000, maxBuffer: 1 << 20 }, (err, stdout) =>
      err ? reject(err) : resolve(stdout),
    ),
  );

/**
 * The node's GPUs: nvidia-smi's answer when it is installed, else the configured list (HANGAR_AGENT_GPUS). A
 * failing nvidia-smi (a driver mismatch after an upgrade, say) falls back too, with the reason, so the node
 * stays visible to the operator instead of dropping out of the fleet.
 */
export async function readGpus(
  configured: AgentGpu[],
  o: { exec?: Exec; warn?: (msg: string, fields: Record<string, unknown>) => void } = {},
): Promise<{ gpus: AgentGpu[]; source: 'nvidia-smi' | 'HANGAR_AGENT_GPUS' }> {
  try {
    const out = await (o.exec ?? execText)('nvidia-smi', GPU_QUERY);
    return { gpus: parseNvidiaSmi(out), source: 'nvidia-smi' };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
      o.warn?.('nvidia-smi failed; reporting the configured GPUs (HANGAR_AGENT_GPUS)', { error: err });
    return { gpus: configured, source: 'HANGAR_AGENT_GPUS' };
  }
}

/**
 * llama.cpp releases that node-llama-cpp bundles under a name that is not a build number, with the build each
 * one is at least. llama.cpp tagged its releases bNNNN (the commit count) until it moved to versions (v0.5.0),
 * and node-llama-cpp's prebuilt binaries are built from a squashed one-commit copy of the source, so the build
 * number compiled into them reads 1. The floor is what the server can rely on: v0.5.0 (node-llama-cpp 3.22.1)
 * knows every architecture up to bailingmoe3 (b10460) and seven newer ones.
 */
const releaseFloors: Record<string, number> = { 'v0.5.0': 10460 };

/** The build number of a llama.cpp release name: "b4748" is build 4748; a known version its floor; else null. */
export function llamaCppBuildOf(release: string): number | null {
  const m = release.match(/^b(\d+)$/);
  if (m) return Number(m[1]);
  return releaseFloors[release] ?? null;
}

/** The llama.cpp engine as the node reports it; a configured build wins over what the release name implies. */
export function llamaCppEngine(release: string, configuredBuild?: number): EngineReport {
  return { name: 'llama.cpp', version: release, build: configuredBuild ?? llamaCppBuildOf(release) };
}

/** Whether a program is on PATH (as the shell would find it), without running it. */
export async function onPath(program: string, envPath: string): Promise<string | null> {
  if (program.includes('/')) return (await executable(program)) ? program : null;
  for (const dir of envPath.split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, program);
    if (await executable(candidate)) return candidate;
  }
  return null;
}

async function executable(file: string) {
  try {
    const st = await fs.stat(file);
    if (!st.isFile()) return false;
    await fs.access(file, fs.constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * The command that serves a vLLM replica on this node: the configured one (HANGAR_AGENT_VLLM_COMMAND) when its
 * program exists, else `vllm serve` when vllm is on PATH, else null (vLLM is not installed here).
 */
export async function vllmCommand(configured: string[] | undefined, envPath: string): Promise<string[] | null> {
  if (configured?.[0]) return (await onPath(configured[0], envPath)) ? configured : null;
  return (await onPath('vllm', envPath)) ? ['vllm', 'serve'] : null;
}

/**
 * vLLM, when this node can run it. Its version is not asked for: `vllm --version` imports torch and takes
 * seconds, too slow for a heartbeat.
 */
export async function vllmEngine(configured: string[] | undefined, envPath: string): Promise<EngineReport | null> {
  return (await vllmCommand(configured, envPath)) ? { name: 'vllm', version: null, build: null } : null;
}

/** Bytes free for models on the disk that holds the agent's directory (what an unprivileged user may use). */
export async function diskFree(dir: string): Promise<number> {
  const s = await fs.statfs(dir);
  return s.bavail * s.bsize;
}
