import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import { type AgentConfig, advertiseUrl } from './config.js';
import { type ControlPlane, GraphqlControlPlane, type NodeReport } from './control-plane.js';
import { diskFree, type EngineReport, llamaCppEngine, readGpus, vllmCommand, vllmEngine } from './inventory.js';
import { LlamaRuntime } from './llama-runtime.js';
import { ModelCache } from './model-cache.js';
import { NodeChannel } from './node-channel.js';
import { createOpenAiServer } from './openai/http.js';
import { PeerLink, TransferRate } from './peer-fetch.js';
import { createPeerServer, peerOrigin } from './peer-server.js';
import { Runner } from './runner.js';
import { GraphqlTrainControl, type TrainControl } from './train-control.js';
import { LlamaEvaluator } from './train-evaluate.js';
import { VllmEvaluator } from './train-evaluate-vllm.js';
import { TrainWorker } from './trainer.js';

// `hangar agent`: the heartbeat (this node's inventory, every few seconds), the runner (its replicas) and the
// training worker (its LoRA jobs). Built here and started by main.ts, so a test can build one against a stand-in
// control plane and stop it cleanly.

export type Agent = {
  start(): Promise<void>;
  /** Stops the replicas (reported STOPPED) and the trainer (its job reported FAILED), and ends llama.cpp. */
  stop(): Promise<void>;
  /** One heartbeat now (tests; start() runs them on a timer). */
  heartbeat(): Promise<void>;
  runner: Runner;
  trainer: TrainWorker;
};

/** The agent's version is the server package's: they ship together. */
export const AGENT_VERSION = (() => {
  try {
    return String(JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).version);
  } catch {
    return 'unknown';
  }
})();

export function createAgent(
  config: AgentConfig,
  o: { log: Logger; controlPlane?: ControlPlane; trainControl?: TrainControl; runtime?: () => Promise<LlamaRuntime> },
): Agent {
  const { log } = o;
  // One WebSocket to the control plane, opened by the first subscription: the replicas' and the training jobs'
  // work are both pushed on it.
  const channel = new NodeChannel({ url: config.url, token: config.nodeToken, log });
  const controlPlane = o.controlPlane ?? new GraphqlControlPlane(config.url, config.nodeToken, { channel, log });

  // llama.cpp starts once, on first need (the inventory asks at start-up). If it cannot run here, the node
  // still reports and runs vLLM, and each llama.cpp replica fails with the reason.
  let runtime: Promise<LlamaRuntime> | undefined;
  const getRuntime =
    o.runtime ??
    (() => {
      runtime ??= LlamaRuntime.create({ threads: config.threads, gpu: config.gpu, log });
      return runtime;
    });

  // Weights node to node: the cache asks the control plane which nodes hold a file before the mirror, and the peer
  // server gives this node's files to others (peer-fetch.ts, peer-server.ts).
  const peers: PeerLink | null = config.peerListen
    ? new PeerLink({ url: config.url, token: config.nodeToken, cache: (): ModelCache => cache, log })
    : null;
  const cache: ModelCache = new ModelCache(config.dir, {
    auth: { origin: new URL(config.url).origin, token: config.nodeToken },
    peers: peers ?? undefined,
    throttle: config.transferRate ? new TransferRate(config.transferRate) : undefined,
    onBytes: peers?.counted,
  });
  const peerServer = peers
    ? createPeerServer({
        cache,
        log,
        identity: peers.identity,
        throttle: config.transferRate ? new TransferRate(config.transferRate) : undefined,
      })
    : null;
  // Where applications' requests reach this node's llama.cpp replicas (through the control plane's gateway),
  // each replica under an engine key only the control plane is given.
  const http = createOpenAiServer({ log });
  let endpoint: string | undefined;
  const runner = new Runner({
    controlPlane,
    cache,
    runtime: getRuntime,
    vllmCommand: () => vllmCommand(config.vllmCommand, config.searchPath),
    baseUrl: config.url,
    log,
    pollMs: config.pollMs,
    // llama-server and vLLM bind where the agent listens, each on a port of its own.
    external: { host: config.listen.host, llamaServer: config.llamaServer, readyMs: config.engineReadyMs },
    serving: {
      http,
      endpoint: () => {
        if (!endpoint) throw new Error('the agent’s endpoint is not listening yet');
        return endpoint;
      },
    },
  });

  const trainer = new TrainWorker({
    control: o.trainControl ?? new GraphqlTrainControl(config.url, config.nodeToken, { log, channel }),
    workDir: path.join(config.dir, 'train'),
    trainer: config.trainer,
    graceMs: config.trainerGraceMs,
    log,
    gpus: async () => (await readGpus(config.gpus, { warn: log.warn })).gpus,
    evaluator: new LlamaEvaluator({ gpu: config.gpu, threads: config.threads, log }),
    vllmEvaluator: new VllmEvaluator({
      command: () => vllmCommand(config.vllmCommand, config.searchPath),
      readyMs: config.engineReadyMs,
      log,
    }),
  });

  let llamaEngine: EngineReport | null = null;
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  /** The heartbeat being sent, so a stop waits for it: landing after leaveNode it would bring the node back. */
  let beating: Promise<void> | undefined;
  let lastError: string | undefined;

  const inventory = async (): Promise<NodeReport> => {
    const { gpus } = await readGpus(config.gpus, { warn: log.warn });
    const vllm = await vllmEngine(config.vllmCommand, config.searchPath);
    return {
      gpus,
      engines: [llamaEngine, vllm].filter((e): e is EngineReport => e !== null),
      diskFreeBytes: await diskFree(config.dir).catch(() => null),
      agentVersion: AGENT_VERSION,
    };
  };

  let filesError: string | undefined;
  /** What this node holds and fetches, for other nodes; a failure is said once and does not fail the heartbeat. */
  const reportFiles = async () => {
    try {
      await peers?.report();
      filesError = undefined;
    } catch (err) {
      const msg = (err as Error).message;
      if (msg !== filesError) log.warn('could not report this node’s model files to the control plane', { error: msg });
      filesError = msg;
    }
  };

  const heartbeat = async () => {
    try {
      await controlPlane.reportNode(await inventory());
      await reportFiles();
      if (lastError !== '') log.info('reporting to the control plane', { url: config.url });
      // Back after failures: the training worker sends what it kept now (see TrainWorker.controlPlaneBack).
      if (lastError) trainer.controlPlaneBack();
      lastError = '';
    } catch (err) {
      const msg = (err as Error).message;
      // Keep going: a control plane restart or a network blip must not take the node's replicas down.
      if (msg !== lastError) log.warn('the heartbeat did not get through; trying again', { error: msg });
      lastError = msg;
    }
    // Assignments right after a heartbeat, unless they are pushed: the placement may have changed with what this
    // node just reported.
    if (!stopped) await runner.afterHeartbeat();
  };

  return {
    runner,
    trainer,
    heartbeat,
    async start() {
      await fs.mkdir(config.dir, { recursive: true });
      const bound = new URL(await http.listen(config.listen));
      const advertised = advertiseUrl(config, Number(bound.port));
      endpoint = advertised.url;
      if (advertised.note) log.warn(advertised.note);
      if (peers && peerServer && config.peerListen) {
        peers.url = peerOrigin(await peerServer.listen(config.peerListen), advertised.url);
        log.info('serving model files to other nodes', { at: peers.url });
      }
      log.info('serving replicas', { listen: `${config.listen.host}:${bound.port}`, endpoint });
      try {
        const rt = await getRuntime();
        llamaEngine = llamaCppEngine(rt.release, config.llamaCppBuild);
        log.info(`llama.cpp is ready on ${rt.gpu ? `the GPU (${rt.gpu})` : 'the CPU'}`, {
          release: rt.release,
          build: llamaEngine.build,
        });
      } catch (err) {
        log.error('llama.cpp cannot run on this node; its replicas will fail', { error: (err as Error).message });
      }
      const loop = async () => {
        if (stopped) return;
        beating = heartbeat();
        await beating;
        if (!stopped) timer = setTimeout(loop, config.heartbeatMs);
      };
      await loop();
      runner.start();
      trainer.start();
    },
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await beating?.catch(() => {});
      // Said first, so the control plane places this node's replicas elsewhere while these ones stop.
      try {
        await controlPlane.leave?.();
        log.info('told the control plane this node is leaving');
        // The control plane drains the serving replicas (it sends them no new request, waits for those they have)
        // and then asks for each to stop: a request being answered is not cut by the node going away. Waited for
        // only while its word can reach this node (the work channel is up).
        if (controlPlane.leave && config.drainGraceMs > 0 && runner.running() > 0) {
          log.info('waiting for this node’s replicas to drain', { replicas: runner.running() });
          const drained = await runner.drained(config.drainGraceMs, () => channel.up);
          if (!drained)
            log.warn('stopping replicas that did not drain within HANGAR_AGENT_DRAIN_GRACE_SECONDS', {
              replicas: runner.running(),
            });
        }
      } catch (err) {
        log.warn('could not tell the control plane this node is leaving; it shows offline once heartbeats stop', {
          error: (err as Error).message,
        });
      }
      await Promise.all([runner.stopAll(), trainer.stop()]);
      channel.close();
      await http.close();
      await peerServer?.close();
      if (runtime) await (await runtime.catch(() => undefined))?.dispose();
    },
  };
}
