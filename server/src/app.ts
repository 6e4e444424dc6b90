import http from 'node:http';
import type { Duplex } from 'node:stream';
import v8 from 'node:v8';
import type { Logger } from '@hangar/common/log';
import { waitUntil } from '@hangar/common/retry';
import { WebSocketServer } from 'ws';
import { notServed, nulRefusal, refuseUpgrade } from './app-refusals.js';
import { buildServices } from './app-services.js';
import { AuditService } from './audit/audit.service.js';
import { LiveCallers } from './auth/live.js';
import { LoginLimits } from './auth/login-limits.js';
import { isOwnOrigin } from './auth/origin.js';
import { installModelEvents } from './catalog/model-events.js';
import { installServedNames } from './catalog/served-names.js';
import type { Config } from './config.js';
import type { Services } from './context.js';
import { type Database, openDatabase } from './db/database.js';
import type { EmbeddedDatabase } from './db/embedded.js';
import { pendingMigrations } from './db/migrate.js';
import { databaseBack } from './db/outage.js';
import { installGpuTime } from './fleet/gpu-time.js';
import { registerPeerMetrics } from './fleet/peer-metrics.js';
import { ScalingLoop } from './fleet/scaling-loop.js';
import { installServingWorkEvents } from './fleet/serving-work.js';
import { Gateway } from './gateway/gateway.js';
import { LoadReport } from './gateway/load-report.js';
import { installUsageRollups } from './gateway/usage-rollup.js';
import { registerCostMetrics } from './governance/cost-metrics.js';
import { registerLimitMetrics } from './governance/limits-metrics.js';
import { attachGraphqlWs } from './graphql/ws.js';
import { buildYoga } from './graphql/yoga.js';
import { hfAuthorization, hfRoutes } from './hf/hf.http.js';
import { HfMirror } from './hf/hf.service.js';
import { PullThrough } from './hf/pull-through.js';
import { ConnectionShares } from './http/connection-shares.js';
import {
  guardBody,
  isApiPath,
  isUpload,
  type ReadinessCheck,
  readiness,
  urlHasNul,
  withDeadline,
} from './http/edge.js';
import { sendJson } from './http/reply.js';
import { edgeFor, type Route } from './http/routes.js';
import { serveConsole } from './http/static.js';
import { listenForMetrics, metricsRoute } from './metrics/metrics.http.js';
import { Metrics } from './metrics/metrics.js';
import { mirrorCredentials, serveMirror, uploadToMirror } from './mirror/serve.js';
import { listen, makePubSub } from './pubsub.js';
import { trainDataRoute, trainRoutes } from './train/train.http.js';

export type App = {
  /** Listens on config.host:config.port (0 picks a free port); resolves with the bound URL. */
  start(): Promise<string>;
  /** Stops accepting, lets in-flight requests finish (bounded), closes sockets, workers and the database. */
  stop(): Promise<void>;
  yoga: ReturnType<typeof buildYoga>;
  db: Database;
  services: Services;
  metrics: Metrics;
  /** Where HANGAR_METRICS_LISTEN's listener serves, once started; undefined when /metrics is on the main port. */
  metricsUrl(): string | undefined;
};

export type AppOptions = {
  config: Config;
  log: Logger;
  print?: (text: string) => void;
  database?: Database;
  /** The embedded PostgreSQL main.ts began to start before loading this module (db/database.ts). */
  embedded?: Promise<EmbeddedDatabase>;
};

/**
 * Prisma's query compiler is WebAssembly (3.4 MB). By default V8 recompiles its busy functions with its optimising
 * compiler in the background, and that alone was 0.8 s of CPU during a start (on a 2-core machine, taken from the
 * start itself) and 70 MiB of an idle server's RSS (the compiler's scratch memory, never handed back to the
 * system), while the server's CPU per request stayed the same without it: Prisma compiles a query shape once and
 * caches the plan, so the wasm is not where requests spend their time. Measured with bench/start.ts, and per
 * request with the server's CPU time over 2000 GraphQL requests. Set before the first query compiles the module
 * (V8 reads the flag then); for the whole process, as V8 flags are.
 */
function keepWasmOnBaselineTier() {
  v8.setFlagsFromString('--liftoff-only');
}

export async function createApp({
  config,
  log,
  print = (t) => process.stdout.write(`${t}\n`),
  database,
  embedded,
}: AppOptions): Promise<App> {
  // How long each step of the start took (ms), logged at debug level once listening: where a slow start goes.
  // `modules` is the time from the process's start to here: loading and evaluating the code.
  const phases: Record<string, number> = { modules: Math.round(performance.now()) };
  let phaseFrom = performance.now();
  const phase = (name: string) => {
    const now = performance.now();
    phases[name] = Math.round(now - phaseFrom);
    phaseFrom = now;
  };
  keepWasmOnBaselineTier();
  const db = database ?? (await openDatabase(config, log, embedded));
  phase('database');
  const prisma = db.prisma;
  const pubsub = makePubSub();
  // Its connection (a SCRAM exchange and LISTEN) opens while the start goes on, not after it; awaited below.
  const listening = listen(db.url, pubsub, log);
  const stopListening = () => listening.then((l) => l.stop());
  // Before any loop judges a lease or a node by it (db/clock.ts).
  await prisma.clock.sync();
  const loginLimits = new LoginLimits(db.url);
  const audit = new AuditService(prisma, log);
  const services = buildServices({ prisma, audit, config, log, loginLimits });
  try {
    // First: a replica on storage the database's mirror is not on refuses before it changes anything.
    await services.mirror.openStorage();
    phase('storage');
    await installModelEvents(prisma);
    await installServingWorkEvents(prisma);
    // Before anything changes a replica: the database records each replica's GPU time (fleet/gpu-time.ts).
    await installGpuTime(prisma);
    // Before the gateway writes usage: the hours and days add up every minute written (gateway/usage-rollup.ts).
    await installUsageRollups(prisma);
    phase('modelEvents');
    // Before hangar.yaml's models are written: each model and adapter claims its name (served-names.ts).
    await installServedNames(prisma);
    await services.catalog.loadDeclared();
    // After the models, whose names a declared limit may name.
    await services.limits.loadDeclared(config.configFile);
    // hangar.yaml's training.generalQuestions: the forgetting check's questions (train/site-questions.ts).
    await services.train.generalQuestions.load(config.configFile);
    // hangar.yaml's prices, and the price table spend budgets read (governance/pricing.ts).
    await services.cost.start(pubsub);
    phase('catalog');
  } catch (err) {
    // A bad hangar.yaml stops the start with its message; the embedded database must not be left running.
    await stopListening();
    if (!database) await db.close();
    throw err;
  }
  try {
    await services.auth.ensureFirstAdmin(print);
    phase('firstAdmin');
  } catch (err) {
    await stopListening();
    if (!database) await db.close();
    throw err;
  }
  const listener = await listening;
  phase('listen');
  services.auth.keepCredentials({ pubsub, listeningSince: () => listener.listeningSince(), log });
  // Off unless an OTEL_* variable names a collector: then one exporter for GraphQL's and the gateway's spans.
  // Imported only then: the SDK is not loaded, and costs no start time, on a server that does not trace.
  const tracing = config.tracing
    ? (await import('./telemetry/tracing.js')).startTracing(config.tracing, log)
    : undefined;
  const metrics = new Metrics({
    db: prisma,
    log,
    isOnline: (node) => services.fleet.isOnline(node),
    gatewayInFlight: () => services.gateway.inFlightTotal(),
  });
  // Limits read before the gateway takes a request, and again on every change (governance/limits.service.ts).
  await services.limits.start(pubsub);
  registerLimitMetrics(metrics.registry, services.limits.enforcer);
  const spend = registerCostMetrics(metrics.registry, services.cost.pricing);
  const peerMetrics = registerPeerMetrics(metrics.registry, services.peers);
  services.gateway = new Gateway({
    limits: services.limits.gate,
    db: prisma,
    config,
    log,
    auth: services.auth,
    org: services.org,
    catalog: services.catalog,
    pubsub,
    listeningSince: () => listener.listeningSince(),
    onUsage: (e) => {
      metrics.observeGateway(e);
      spend.count(e);
      tracing?.describeGatewayCall(e);
    },
  });

  // Autoscaling (fleet/scaling-loop.ts) judges every server's load: this one's is published for it.
  const loadReport = new LoadReport({ db: prisma, log, counts: () => services.gateway.loadCounts() });
  const scaling = new ScalingLoop({
    db: prisma,
    audit: services.audit,
    windowMs: config.scaleWindowSeconds * 1000,
    fleet: services.fleet,
    onDecision: metrics.observeScaling,
    log,
  });

  const live = new LiveCallers({
    auth: services.auth,
    pubsub,
    log,
    limits: {
      perConnection: config.maxSubscriptionsPerConnection,
      perCaller: config.maxSubscriptionsPerCaller,
      connectionsPerCaller: config.maxConnectionsPerCaller,
    },
  });
  live.start();
  const yoga = buildYoga({
    prisma,
    tracing,
    config,
    log,
    pubsub,
    services,
    live,
    metrics: metrics.registry,
    onSubscriptionResult: metrics.observeSubscriptionResult,
  });
  phase('yoga');
  const metricsHttp = metricsRoute({ metrics, listenElsewhere: Boolean(config.metricsListen) });
  let metricsListener: Awaited<ReturnType<typeof listenForMetrics>> | undefined;
  // Model cards show the Hub's images, and an internal Hub may be plain http.
  const consoleHandler = serveConsole(config.webDist, {
    imageSources: config.hubUrl ? [new URL(config.hubUrl).origin] : [],
  });
  const mirrorFiles = serveMirror({
    db: prisma,
    paths: services.mirror.paths,
    auth: services.auth,
    owners: services.org,
    requireToken: config.mirrorRequireToken,
    internalToken: services.mirror.internalToken,
    log,
    sent: peerMetrics.mirrorSent,
    bucket: () => services.mirror.bucket,
    presignSeconds: config.s3PresignSeconds,
  });
  // The same files and token rules, in the Hugging Face Hub's protocol (HF_ENDPOINT=<hangar>/hf).
  const hfFiles = hfRoutes({
    hf: new HfMirror({ db: prisma, hubUrl: config.hubUrl }),
    paths: services.mirror.paths,
    auth: services.auth,
    requireToken: config.mirrorRequireToken,
    internalToken: services.mirror.internalToken,
    log,
    bucket: () => services.mirror.bucket,
    // HANGAR_HF_PULL_THROUGH=on, with a registry to pull from (HANGAR_HUB_URL=off turns it off with the explorer).
    pull:
      config.hfPullThrough && config.hubUrl
        ? new PullThrough({
            db: prisma,
            mirror: services.mirror,
            hubUrl: config.hubUrl,
            hubToken: config.hubToken,
            timeoutMs: config.hubTimeoutMs,
            log,
          })
        : null,
  });
  const mirrorUpload = uploadToMirror({ mirror: services.mirror, audit, maxBytes: 64 * 1024 ** 3 });
  let listeningUrl = `http://${config.host}:${config.port}`;
  services.mirror.setBaseUrl(() => listeningUrl);
  services.kbDatasets.setBaseUrl(() => listeningUrl);
  services.train.setBaseUrl(() => listeningUrl);
  services.fleet.setAgentUrl(() => config.publicUrl ?? listeningUrl);
  const train = trainRoutes({ train: services.train, artifacts: services.trainArtifacts, audit });

  // The route table: every path outside the console, in the order they are tried. Each route reads its own
  // credentials and declares who may call it (http/routes.ts); the edge gives it a request id and its caller.
  // GraphQL and /v1 identify in their own protocol (Yoga's plugins, the gateway's callers) and get the id.
  const routes: Route[] = [
    {
      name: 'gateway',
      match: (path) => path === '/v1' || path.startsWith('/v1/'),
      answersRequestId: false,
      guardsOwnBody: true,
      handle: (req, res, edge) => {
        const handle = () => services.gateway.handle(req, res, edge.path, edge.requestId, edge.log);
        return tracing ? tracing.gatewayCall(req, res, edge.path, edge.requestId, handle) : handle();
      },
    },
    {
      name: 'graphql',
      match: (path) => path === '/graphql',
      handle: async (req, res) => {
        await yoga.requestListener(req, res);
      },
    },
    {
      name: 'healthz',
      match: (path) => path === '/healthz',
      handle: async (_req, res) => sendJson(res, 200, { ok: true }),
    },
    { name: 'readyz', match: (path) => path === '/readyz', handle: (_req, res) => readyz(res) },
    metricsHttp,
    mirrorUpload,
    {
      name: 'mirror files',
      match: (path) => path.startsWith('/mirror/'),
      credentials: (req) => mirrorCredentials(req),
      handle: (req, res, edge) => mirrorFiles(req, res, edge.path, edge),
    },
    {
      name: 'hf',
      match: (path) => path === '/hf' || path.startsWith('/hf/'),
      credentials: (req) => mirrorCredentials(req, hfAuthorization(req)),
      handle: (req, res, edge) => hfFiles(req, res, edge.path, edge),
    },
    trainDataRoute({ train: services.train, audit }),
    {
      name: 'train',
      match: (path) => path.startsWith('/api/train/'),
      handle: async (req, res, edge) => {
        if (!(await train(req, res, edge))) notServed(res, edge.path);
      },
    },
  ];
  const edgeRoutes = edgeFor(routes, {
    identify: (credentials) => services.auth.identify(credentials),
    refused: (actor, action, target, message) => audit.refused(actor, action, target, message),
    log,
    trustProxy: config.trustProxy,
  });

  let inFlight = 0;
  let draining = false;
  const server = http.createServer(
    {
      // No total deadline (long downloads, SSE streams, uploads of weights): bodies are guarded per route below.
      requestTimeout: 0,
      headersTimeout: config.headersTimeoutMs,
      // How often Node looks for connections past headersTimeout; its default (30 s) would stretch the limit.
      connectionsCheckingInterval: Math.min(30_000, Math.max(100, Math.floor(config.headersTimeoutMs / 4))),
    },
    async (req, res) => {
      inFlight++;
      res.on('close', () => inFlight--);
      const path = (req.url ?? '/').split('?')[0] ?? '/';
      const route = edgeRoutes.find(path, req.method ?? 'GET');
      const edge = edgeRoutes.open(req, res, path, route);
      try {
        if (draining) res.setHeader('connection', 'close');
        if (urlHasNul(req.url ?? '')) return await refuseNul(req, res, edge);
        if (!route?.guardsOwnBody) guardBody(req, res, isUpload(req.method, path), config, edge.log, path);
        if (route) return await edgeRoutes.run(route, req, res, edge);
        if (isApiPath(path)) return notServed(res, path);
        if (req.method === 'GET' || req.method === 'HEAD') return await consoleHandler(req, res);
        sendJson(res, 405, { error: `${req.method} is not served at ${path}` });
      } catch (err) {
        edge.log.error('request failed', { path, error: err });
        if (!res.headersSent) sendJson(res, 500, { error: 'unexpected error', requestId: edge.requestId });
        else res.destroy();
      }
    },
  );
  // Past HANGAR_MAX_CONNECTIONS a new connection is closed as it arrives, and within it each client address has
  // a share and connections still sending their headers a smaller budget: slow or hoarding clients cannot take
  // all the sockets (http/connection-shares.ts).
  new ConnectionShares(
    {
      total: config.maxConnections,
      perAddress: config.maxConnectionsPerAddress,
      pending: config.maxPendingConnections,
    },
    log,
  ).attach(server);

  const refuseNul = nulRefusal(services.auth, audit);

  // Each check says why the server is not ready, in words safe for anyone to read; the details go to the log.
  let databaseAnswered = true;
  const readinessChecks: ReadinessCheck[] = [
    () => (draining ? 'shutting down' : undefined),
    async () => {
      try {
        const pending = await withDeadline(
          pendingMigrations((sql) => prisma.$queryRawUnsafe(sql)),
          5000,
          'the database',
        );
        if (!databaseAnswered) {
          log.info('ready: the database answers again');
          // The loops and live events still backing off try now: /readyz waits for them too.
          databaseBack();
        }
        databaseAnswered = true;
        return pending.length ? `migrations not applied: ${pending.join(', ')}` : undefined;
      } catch (err) {
        // Once per outage, not once per probe: a load balancer asks every few seconds.
        if (databaseAnswered) log.warn('not ready: the database is unreachable', { error: err });
        databaseAnswered = false;
        return 'database unreachable';
      }
    },
    // The loops that found the database gone and have not got through since (the check above may pass a few
    // seconds before they try again), and live events, which go quiet while their connection is down.
    () => {
      const loops = [services.mirror.health, services.serveJobs.health, services.train.health, services.fleet.health];
      const paused = loops.filter((l) => l.paused).map((l) => l.name);
      return paused.length ? `waiting for the database: ${paused.join(', ')}` : undefined;
    },
    () => (listener.listening() ? undefined : 'live events: not connected to the database (reconnecting)'),
    () => db.trouble?.() ?? undefined,
  ];
  const readyz = async (res: http.ServerResponse) => {
    const answer = await readiness(readinessChecks);
    return sendJson(res, answer.ready ? 200 : 503, answer);
  };

  const wss = new WebSocketServer({ noServer: true, maxPayload: config.maxBodyBytes });
  const wsServer = attachGraphqlWs(wss, {
    yoga,
    auth: services.auth,
    live,
    trustProxy: config.trustProxy,
    idleMs: config.wsIdleSeconds * 1000,
  });
  server.on('upgrade', (req, socket: Duplex, head) => {
    const path = (req.url ?? '/').split('?')[0];
    if (path !== '/graphql' || draining) return refuseUpgrade(socket, 404, 'Not Found');
    // A browser sends the session cookie with a WebSocket opened by any site; only our own pages may use it.
    // Pages of the origins HANGAR_CORS_ORIGINS lists may, as they may over HTTP.
    // Scripts (Node's ws, curl) send no Origin; they must bring a token in connectionParams anyway.
    const origin = req.headers.origin;
    if (origin && !isOwnOrigin(origin, req.headers.host ?? null, config)) {
      log.warn('refused a WebSocket from a foreign origin', { origin: req.headers.origin });
      return refuseUpgrade(socket, 403, 'Forbidden');
    }
    wss.handleUpgrade(req, socket, head, (ws) => wss.emit('connection', ws, req));
  });

  phase('routes');
  let stopped: Promise<void> | undefined;
  return {
    yoga,
    db,
    services,
    metrics,
    metricsUrl: () => metricsListener?.url,
    start: () =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(config.port, config.host, async () => {
          if (config.metricsListen) {
            try {
              metricsListener = await listenForMetrics(metrics, config.metricsListen, log);
            } catch (err) {
              server.close();
              return reject(new Error(`HANGAR_METRICS_LISTEN: cannot listen there (${String(err)})`));
            }
          }
          const address = server.address();
          const port = typeof address === 'object' && address ? address.port : config.port;
          const url = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`;
          listeningUrl = url;
          phase('bind');
          // Downloads left unfinished by the last run resume now, not at the first request.
          services.fleet.startPlacement({ events: { pubsub, listeningSince: () => listener.listeningSince() } });
          void services.gateway.start();
          loadReport.start();
          scaling.start();
          services.serveJobs.start();
          services.train.start();
          services.usage.pruner.start();
          // Datasets a server that went away left RUNNING are failed, saying so.
          void services.kbDatasets.start().catch((err) => log.warn('kb datasets: sweep failed', { error: err }));
          services.mirror.start(db.embedded).then(() => {
            phase('mirror');
            log.debug('start phases (ms)', phases);
            log.info('Hangar is listening', {
              url,
              graphql: `${url}/graphql`,
              database: db.embedded ? 'embedded' : 'DATABASE_URL',
            });
            resolve(url);
          }, reject);
        });
      }),
    stop: () => {
      stopped ??= (async () => {
        draining = true;
        // The requests and workers still draining need the database: one that exits now is not restarted.
        db.stopping?.();
        // Jobs first: a job step must not start on a server that is going away.
        const jobsStopped = services.serveJobs.stop();
        const trainStopped = services.train.stop();
        const datasetsStopped = services.kbDatasets.stop();
        const closed = new Promise<void>((r) => server.close(() => r()));
        server.closeIdleConnections();
        await waitUntil(() => inFlight === 0, { timeoutMs: config.shutdownGraceMs, pollMs: 50 });
        if (inFlight > 0) log.warn('shutting down with requests still open', { inFlight });
        await jobsStopped;
        await trainStopped;
        await datasetsStopped;
        await services.mirror.stop();
        await scaling.stop();
        await services.fleet.stopPlacement();
        await loadReport.stop();
        await services.gateway.stop();
        // After the gateway's last request: what it spent is settled, and its unused slices go back.
        await services.limits.stop();
        await wsServer.dispose();
        for (const ws of wss.clients) ws.terminate();
        server.closeAllConnections();
        await closed;
        await metricsListener?.close();
        // After every request has ended, so their spans are in what it sends.
        await tracing?.stop();
        live.stop();
        services.cost.stop();
        services.usage.pruner.stop();
        services.auth.stopKeepingCredentials();
        await listener.stop();
        await loginLimits.close();
        if (!database) await db.close();
        log.info('Hangar stopped');
      })();
      return stopped;
    },
  };
}
