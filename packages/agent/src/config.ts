import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';

// The node agent's settings. The agent is a separate process on each GPU node with settings of its own, so it
// has its own reader: src/config.ts stays the only reader of process.env for the server process, and this file
// is the only one for the agent. A bad value stops start-up with a message naming the variable.

const gpu = z.object({
  index: z.number().int().min(0).optional(),
  name: z.string().min(1, 'a GPU name such as "RTX 4090"').max(200),
  totalMiB: z.number().int().min(0, 'MiB, 0 or more'),
  freeMiB: z.number().int().min(0, 'MiB, 0 or more'),
});

const gpuList = z
  .string()
  .transform((s, ctx) => {
    try {
      return JSON.parse(s) as unknown;
    } catch {
      ctx.addIssue({ code: 'custom', message: 'JSON such as [{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]' });
      return z.NEVER;
    }
  })
  .pipe(z.array(gpu, { error: 'a JSON array of {"name","totalMiB","freeMiB"}' }).max(64, 'at most 64 GPUs'));

/** host:port, as HANGAR_AGENT_LISTEN takes it: 0.0.0.0:8080, [::]:8080, 127.0.0.1:0 (any free port). */
const listen = z
  .string()
  .trim()
  .transform((s, ctx) => {
    const m = s.match(/^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):(\d{1,5})$/);
    const port = Number(m?.[3]);
    if (!m || port > 65535) {
      ctx.addIssue({
        code: 'custom',
        message:
          'host:port such as 0.0.0.0:8080 (every interface, what a node serving the fleet needs), [::]:8080, or 127.0.0.1:0 (this machine only, any free port)',
      });
      return z.NEVER;
    }
    return { host: m[1] ?? m[2] ?? '', port };
  });

/** The OpenAI base URL the control plane is given; a bare origin gets /v1, the path the agent serves. */
const advertise = z
  .string()
  .trim()
  .transform((s, ctx) => {
    let u: URL | undefined;
    try {
      u = new URL(s);
    } catch {}
    const bad = !u
      ? 'an http:// URL such as http://10.0.0.5:8080/v1'
      : !/^https?:$/.test(u.protocol)
        ? 'an http:// or https:// URL'
        : u.username || u.password
          ? 'a URL without user:password@: the control plane sends the engine key itself'
          : u.search || u.hash
            ? 'a URL without ?query or #fragment'
            : u.port === '0'
              ? 'a real port, not 0: the control plane connects to it'
              : u.pathname !== '/' && u.pathname.replace(/\/+$/, '') !== '/v1'
                ? 'the agent serves OpenAI under /v1: give http://host:port or http://host:port/v1'
                : null;
    if (bad || !u) {
      ctx.addIssue({ code: 'custom', message: bad ?? 'an http:// URL' });
      return z.NEVER;
    }
    return `${u.origin}/v1`;
  });

const schema = z.object({
  HANGAR_URL: z
    .string({ error: "the control plane's URL, such as http://127.0.0.1:4000" })
    .url("the control plane's URL, such as http://127.0.0.1:4000")
    .refine((u) => /^https?:\/\//.test(u), 'an http:// or https:// URL'),
  HANGAR_NODE_TOKEN: z
    .string({ error: "this node's token (hgn_…), as the createNode mutation returned it" })
    .regex(/^hgn_\S+$/, "a node token starting hgn_, as the createNode mutation returned it (hgr_ is an API token's)"),
  HANGAR_AGENT_DIR: z.string().min(1, 'a directory path').default('./agent-data'),
  HANGAR_AGENT_GPUS: gpuList.optional(),
  HANGAR_AGENT_HEARTBEAT_MS: z.coerce
    .number({ error: 'milliseconds between heartbeats' })
    .int('a whole number of milliseconds')
    .min(500, 'at least 500')
    .max(60_000, 'at most 60000 (a node unseen for 30 s counts as offline)')
    .default(5000),
  HANGAR_AGENT_POLL_MS: z.coerce.number().int().min(100, 'at least 100').max(60_000, 'at most 60000').default(2000),
  HANGAR_AGENT_VLLM_COMMAND: z.string().optional(),
  HANGAR_AGENT_LLAMA_SERVER: z
    .string()
    .trim()
    .min(1, "llama-server's path, such as /opt/llama.cpp/build/bin/llama-server")
    .refine((s) => !/["']/.test(s), 'words split on spaces, without quotes: use a path without spaces')
    .optional(),
  HANGAR_AGENT_ENGINE_READY_MS: z.coerce
    .number({ error: 'milliseconds an external engine (llama-server, vLLM) may take to answer after starting' })
    .int('a whole number of milliseconds')
    .min(1000, 'at least 1000')
    .max(3_600_000, 'at most 3600000 (an hour)')
    .optional(),
  HANGAR_AGENT_THREADS: z.coerce.number().int().min(1, 'at least 1').max(1024).optional(),
  HANGAR_AGENT_GPU: z
    .enum(['auto', 'false'], { error: 'auto (the GPU when llama.cpp finds one) or false (the CPU)' })
    .default('auto'),
  HANGAR_AGENT_LLAMACPP_BUILD: z.coerce.number().int().min(1, 'a llama.cpp build number such as 4748').optional(),
  HANGAR_TRAINER: z
    .string()
    .trim()
    .min(1, 'a command line such as "python3 /opt/hangar/train_lora.py"')
    // Split on whitespace, like HANGAR_AGENT_VLLM_COMMAND: quotes would reach the program as part of its name.
    .refine(
      (s) => !/["']/.test(s),
      'words split on spaces, without quotes: use a path without spaces, or a wrapper script',
    )
    .optional(),
  HANGAR_TRAINER_GRACE_MS: z.coerce
    .number({ error: 'milliseconds the trainer gets to stop after SIGTERM, before SIGKILL' })
    .int('a whole number of milliseconds')
    .min(100, 'at least 100')
    .max(600_000, 'at most 600000 (10 minutes): a cancelled job holds its GPU until then')
    .default(10_000),
  // How long a stopping agent (SIGTERM) waits for the control plane to drain its replicas (no new requests, those
  // running finish) and ask for each to stop, before it stops the rest itself: a little over the control plane's
  // HANGAR_DRAIN_GRACE_SECONDS (120), so that its word usually comes first.
  HANGAR_AGENT_DRAIN_GRACE_SECONDS: z.coerce
    .number({ error: 'seconds a stopping agent waits for its replicas to drain' })
    .int('a whole number of seconds')
    .min(0, '0 (stop at once) or more')
    .max(86_400, 'at most 86400')
    .default(130),
  // Loopback by default, like the server's HOST: a node exposes its models to the network only when told to.
  HANGAR_AGENT_LISTEN: listen.default({ host: '127.0.0.1', port: 0 }),
  HANGAR_AGENT_ADVERTISE_URL: advertise.optional(),
  // Weights node to node (peer-server.ts, peer-fetch.ts): where this node serves its model files to other nodes
  // (default: the listen host, any free port), whether it fetches from and serves to them at all, and a rate limit
  // on its model transfers (downloads share one, files served to other nodes another), for tests and benchmarks.
  HANGAR_AGENT_PEER_LISTEN: listen.optional(),
  HANGAR_AGENT_PEERS: z.enum(['on', 'off'], { error: 'on (fetch from and serve to other nodes) or off' }).default('on'),
  HANGAR_AGENT_TRANSFER_RATE: z.coerce
    .number({
      error: 'bytes per second for model downloads together (and again for files served), such as 10485760 (10 MiB/s)',
    })
    .int('a whole number of bytes per second')
    .min(65_536, 'at least 65536 (64 KiB/s)')
    .optional(),
  HANGAR_LOG_LEVEL: z.enum(['debug', 'info', 'warn', 'error', 'silent']).default('info'),
});

/** The trainer shipped with the agent: packages/agent/trainer/train_lora.py, found from this file so any cwd works. */
export const DEFAULT_TRAINER = ['python3', fileURLToPath(new URL('../trainer/train_lora.py', import.meta.url))];

export type AgentGpu = { index: number; name: string; totalMiB: number; freeMiB: number };

export type AgentConfig = {
  /** The control plane, without a trailing slash. */
  url: string;
  nodeToken: string;
  /** Where downloaded models are cached (<dir>/models/<sha256>.gguf). */
  dir: string;
  /** GPUs to report when nvidia-smi is not there (a node without NVIDIA tools, or a test). */
  gpus: AgentGpu[];
  heartbeatMs: number;
  /** How often the assignments are read while they are not pushed (the agent's WebSocket is down). */
  pollMs: number;
  /** The program (and arguments) that serves a vLLM replica; unset: vLLM replicas fail with a reason. */
  vllmCommand: string[] | undefined;
  /** llama-server (and any arguments): serves llama.cpp replicas as a child process; unset: the embedded runtime. */
  llamaServer: string[] | undefined;
  /** How long an external engine may take to answer its probe; unset: 10 min for vLLM, 5 for llama-server. */
  engineReadyMs: number | undefined;
  /** CPU threads for llama.cpp; default the cores it finds useful. */
  threads: number | undefined;
  /** 'auto': llama.cpp on the node's GPU when an installed build can use it (CUDA, Vulkan…), else the CPU. */
  gpu: 'auto' | false;
  /** The llama.cpp build to report when the bundled one cannot say (see inventory.ts). */
  llamaCppBuild: number | undefined;
  /** The LoRA trainer's command line (docs/training.md); `--job … --out …` is appended. */
  trainer: string[];
  /** How long a stopped trainer gets between SIGTERM and SIGKILL. */
  trainerGraceMs: number;
  /** HANGAR_AGENT_DRAIN_GRACE_SECONDS in ms: how long a stopping agent lets its replicas drain. */
  drainGraceMs: number;
  logLevel: 'debug' | 'info' | 'warn' | 'error' | 'silent';
  /** Where the agent's OpenAI-compatible endpoint listens (port 0: any free port, chosen at start). */
  listen: { host: string; port: number };
  /** The endpoint's base URL (…/v1) as the control plane should use it; unset: derived, see advertiseUrl(). */
  advertiseUrl: string | undefined;
  /** PATH, where vllm (or the configured command) is looked for. */
  searchPath: string;
  /** Where the peer server listens; null: off (HANGAR_AGENT_PEERS=off). Port 0: any free port. */
  peerListen: { host: string; port: number } | null;
  /** Bytes per second all model downloads share, and again all files served to other nodes; unset: no limit. */
  transferRate: number | undefined;
};

export class AgentConfigError extends Error {
  override name = 'AgentConfigError';
}

/** Reads the agent's settings from an environment; throws AgentConfigError naming each bad variable. */
export function loadAgentConfig(env: Record<string, string | undefined> = process.env): AgentConfig {
  // An empty variable means unset, as for the server.
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const parsed = schema.safeParse(present);
  if (!parsed.success) {
    // One reason per variable: the first one that failed says what is accepted.
    const seen = new Set<string>();
    const issues = parsed.error.issues.filter((issue) => {
      const name = String(issue.path[0] ?? '?');
      if (seen.has(name)) return false;
      seen.add(name);
      return true;
    });
    const lines = issues.map((issue) => {
      const name = String(issue.path[0] ?? '?');
      const value = present[name];
      // Never echo the token back: it is a secret, and logs travel.
      if (value === undefined) return `${name} is not set: ${issue.message}`;
      const shown = name === 'HANGAR_NODE_TOKEN' ? '(hidden)' : JSON.stringify(value);
      const where = issue.path.length > 1 ? ` (at ${issue.path.slice(1).join('.')})` : '';
      return `${name}=${shown} is not accepted${where}: ${issue.message}`;
    });
    throw new AgentConfigError(`the Hangar agent cannot start: ${lines.join('; ')}`);
  }
  const c = parsed.data;
  const command = c.HANGAR_AGENT_VLLM_COMMAND?.trim().split(/\s+/).filter(Boolean);
  const trainer = c.HANGAR_TRAINER?.trim().split(/\s+/).filter(Boolean);
  return {
    url: c.HANGAR_URL.replace(/\/+$/, ''),
    nodeToken: c.HANGAR_NODE_TOKEN,
    dir: path.resolve(c.HANGAR_AGENT_DIR),
    gpus: (c.HANGAR_AGENT_GPUS ?? []).map((g, i) => ({
      index: g.index ?? i,
      name: g.name,
      totalMiB: g.totalMiB,
      freeMiB: g.freeMiB,
    })),
    heartbeatMs: c.HANGAR_AGENT_HEARTBEAT_MS,
    pollMs: c.HANGAR_AGENT_POLL_MS,
    vllmCommand: command?.length ? command : undefined,
    llamaServer: c.HANGAR_AGENT_LLAMA_SERVER?.split(/\s+/).filter(Boolean),
    engineReadyMs: c.HANGAR_AGENT_ENGINE_READY_MS,
    threads: c.HANGAR_AGENT_THREADS,
    gpu: c.HANGAR_AGENT_GPU === 'auto' ? 'auto' : false,
    llamaCppBuild: c.HANGAR_AGENT_LLAMACPP_BUILD,
    trainer: trainer?.length ? trainer : DEFAULT_TRAINER,
    trainerGraceMs: c.HANGAR_TRAINER_GRACE_MS,
    drainGraceMs: c.HANGAR_AGENT_DRAIN_GRACE_SECONDS * 1000,
    logLevel: c.HANGAR_LOG_LEVEL,
    listen: c.HANGAR_AGENT_LISTEN,
    advertiseUrl: c.HANGAR_AGENT_ADVERTISE_URL,
    searchPath: env.PATH ?? '',
    peerListen:
      c.HANGAR_AGENT_PEERS === 'off'
        ? null
        : (c.HANGAR_AGENT_PEER_LISTEN ?? { host: c.HANGAR_AGENT_LISTEN.host, port: 0 }),
    transferRate: c.HANGAR_AGENT_TRANSFER_RATE,
  };
}

/**
 * The base URL the control plane is given for this agent's endpoint, once it listens on `boundPort`:
 * HANGAR_AGENT_ADVERTISE_URL when set; else the listening address itself; and for a wildcard address (0.0.0.0,
 * ::), which nobody can connect to, this machine's first non-internal IPv4 address. A node with several networks
 * may pick the wrong one: `note` says so, and the operator sets HANGAR_AGENT_ADVERTISE_URL.
 */
export function advertiseUrl(
  config: Pick<AgentConfig, 'listen' | 'advertiseUrl'>,
  boundPort: number,
  interfaces: NodeJS.Dict<os.NetworkInterfaceInfo[]> = os.networkInterfaces(),
): { url: string; note?: string } {
  if (config.advertiseUrl) return { url: config.advertiseUrl };
  const { host } = config.listen;
  const wildcard = host === '0.0.0.0' || host === '::' || host === '0:0:0:0:0:0:0:0';
  if (!wildcard) return { url: `http://${host.includes(':') ? `[${host}]` : host}:${boundPort}/v1` };
  const external = Object.values(interfaces)
    .flat()
    .find((i) => i && i.family === 'IPv4' && !i.internal);
  if (!external)
    return {
      url: `http://127.0.0.1:${boundPort}/v1`,
      note: 'this machine has no network address but loopback: set HANGAR_AGENT_ADVERTISE_URL to the URL the control plane reaches',
    };
  return {
    url: `http://${external.address}:${boundPort}/v1`,
    note: `advertising ${external.address}, this machine's first network address: set HANGAR_AGENT_ADVERTISE_URL if the control plane reaches it by another`,
  };
}
