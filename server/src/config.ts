import path from 'node:path';
import type { z } from 'zod';
import { schema } from './config-schema.js';
import type { UsageRetention } from './gateway/usage-retention-setting.js';
import type { StoreSpec } from './mirror/store/store.js';

// The only reader of process.env. Every setting is parsed here, once, so a bad value stops start-up with a
// message naming the variable and what it accepts, instead of surfacing later as a confusing failure.

// The variables' rules are in config-schema.ts; parseRate is re-exported so its importers keep this path.
export { parseRate } from './config-schema.js';

export type Config = {
  port: number;
  host: string;
  dataDir: string;
  databaseUrl: string | undefined;
  /** Connections for requests, and for the background loops, each process may hold (db/client.ts). */
  dbPoolSizes: { requests: number; loops: number };
  /** HANGAR_WORKERS: processes serving on the port (serve/workers.ts); 1, the default, is this process alone. */
  workers: number;
  publicUrl: string | undefined;
  adminEmail: string | undefined;
  adminPassword: string | undefined;
  /** The registry the explorer browses and training's base repositories come from; null when turned off. */
  hubUrl: string | null;
  hubToken: string | undefined;
  /**
   * Host names and networks the server may fetch from although they are loopback, private, link-local or
   * unique-local (an air-gapped site's internal file servers). The Hub's own origin is always allowed.
   */
  fetchAllow: string[];
  configFile: string | undefined;
  webDist: string;
  sessionHours: number;
  /** Subscriptions one WebSocket connection may hold open at once. */
  maxSubscriptionsPerConnection: number;
  /** Subscriptions one caller (a user, over all their tokens and sessions, or a node) may hold in one process. */
  maxSubscriptionsPerCaller: number;
  /**
   * Whether a proxy in front of Hangar reports the client's address in X-Forwarded-For (the last entry, the one
   * it added). Off, the socket's peer is the client: a header anyone can send must not pick whose sign-in
   * attempts are counted.
   */
  trustProxy: boolean;
  shutdownGraceMs: number;
  maxBodyBytes: number;
  /** The largest document a knowledge-base collection accepts, and the most all of one collection's may add up to. */
  kbDocumentMaxBytes: number;
  kbCollectionMaxBytes: number;
  logLevel: 'debug' | 'info' | 'warn' | 'error' | 'silent';
  /** Origins other than the console's own whose pages may call /graphql with the browser's credentials. */
  corsOrigins: string[];
  /** Connections the server holds at once; more are closed as they arrive. */
  maxConnections: number;
  /** Connections one client address (the socket's peer) may hold at once; more are closed as they arrive. */
  maxConnectionsPerAddress: number;
  /** WebSockets and SSE streams one caller (a user over all their tokens and sessions, or a node) may hold. */
  maxConnectionsPerCaller: number;
  /**
   * Connections that have not sent a whole request's headers yet (new ones, and kept-alive ones between
   * requests) may hold at most this many slots; past it the oldest is closed. Not a setting of its own: a
   * quarter of maxConnections.
   */
  maxPendingConnections: number;
  /** Seconds a signed-in WebSocket may stay open holding no subscription before it is closed. */
  wsIdleSeconds: number;
  /** How long a client has to send a request's headers. */
  headersTimeoutMs: number;
  /** How long a client has to send a whole small body (GraphQL and the other size-capped requests). */
  bodyTimeoutMs: number;
  /**
   * An upload (PUT /mirror, /api/train) may take as long as it needs, but must average at least this many
   * bytes per second over each window of uploadRateWindowMs, or it is cut off: a trickle holds a connection.
   */
  uploadMinBytesPerSecond: number;
  uploadRateWindowMs: number;
  graphiql: boolean;
  /** How many files the mirror downloads at once. */
  mirrorConcurrency: number;
  /** Seconds without a byte before a transfer counts as stalled and is resumed. */
  mirrorStallSeconds: number;
  /**
   * Tries in a row that bring no bytes (a body cut short at once, an HTML page) before a file is failed; any try
   * that moves bytes starts the count again. An unreachable upstream is not counted here: see mirrorGiveUpAfterMs.
   */
  mirrorAttempts: number;
  /**
   * How long an upstream may stay unreachable (refused or reset connections, timeouts, 5xx, 429) before a file is
   * failed. Hours by default: a mirror left alone overnight should ride out an outage of the Hub or a proxy.
   */
  mirrorGiveUpAfterMs: number;
  /** The longest wait between two tries at an unreachable upstream (the backoff's cap; Retry-After may ask more). */
  mirrorRetryMaxMs: number;
  /** Bytes per second all of the mirror's downloads share (per server process); null for no limit. */
  mirrorBandwidth: number | null;
  /** Whether GET /mirror/… needs a credential (node or API token, or a console session); on unless set false. */
  mirrorRequireToken: boolean;
  /** Whether /hf fetches a repository, revision or file the mirror lacks from the Hub on first request. */
  hfPullThrough: boolean;
  /**
   * Whether each file is flushed to the disk before it is marked present. Off, a fetch on a fast link runs at
   * about 1× `curl -o`, on, 0.7× (bench/mirror.ts: the flush is the disk writing the whole file); the
   * start-up check that a present file still has its verified size catches what a crash of the machine leaves
   * on ext4 and XFS (files cut short) either way.
   */
  mirrorFsync: boolean;
  /** HANGAR_MIRROR_STORE: the data dir (`file`) or an S3-compatible bucket (mirror/store/store.ts). */
  mirrorStore: StoreSpec;
  /** HANGAR_S3_FORCE_PATH_STYLE: the bucket's name in the path (MinIO, Ceph RGW). */
  s3ForcePathStyle: boolean;
  /** HANGAR_S3_PRESIGN: seconds a presigned URL for a node holds, or null to stream every file through Hangar. */
  s3PresignSeconds: number | null;
  /** HANGAR_S3_QUOTA: bytes the mirror may keep in its bucket, or null for no quota (mirror/bucket-space.ts). */
  s3QuotaBytes: number | null;
  hubTimeoutMs: number;
  /** The llama.cpp build assumed when no node has reported one. */
  llamaCppBuild: number | undefined;
  /** The context the memory estimate uses at most, unless asked for another. */
  maxContext: number;
  /** Seconds without a report from a running job's node before the job is failed as lost. */
  trainLostSeconds: number;
  /** How long a request for an on-demand model waits for it to wake before it is answered 503. */
  gatewayWakeSeconds: number;
  /** Requests that may wait at once for one model to wake, in one server process; more are answered 503. */
  gatewayWakeQueue: number;
  /** How long the "minute" of a per-minute limit lasts, in seconds (governance/limits-windows.ts): 60 but in tests. */
  limitMinuteSeconds: number;
  /**
   * How long the gateway waits for a replica's first byte (headers) before it counts the replica as failing and
   * tries another. Generous: a long prompt on a busy replica is slow to start, and retrying it doubles the load.
   */
  gatewayFirstByteMs: number;
  /**
   * How long a replica may send nothing, once it has begun to answer, before the answer is cut and the client
   * told why: an engine that hangs mid-answer must not hold the client and the replica's slot for ever.
   */
  gatewayIdleMs: number;
  /** The longest a replica's answer may go on, from its first byte: a stream that never ends is cut. */
  gatewayDeadlineSeconds: number;
  /** HANGAR_GATEWAY_LOAD_FACTOR: a replica named by a prefix or session takes requests up to this times the mean. */
  gatewayLoadFactor: number;
  /** HANGAR_GATEWAY_ROUTES_REREAD_SECONDS: how often the route table reads the whole catalog besides its events. */
  gatewayRoutesRereadSeconds: number;
  /** HANGAR_PLACEMENT_REREAD_SECONDS: how often the placement pass runs besides when something changed. */
  placementRereadSeconds: number;
  /** HANGAR_SCALE_WINDOW_SECONDS: how long load stays above or below a model's target before it scales. */
  scaleWindowSeconds: number;
  /** HANGAR_DRAIN_GRACE_SECONDS: how long a replica being removed may finish its requests before it is stopped. */
  drainGraceSeconds: number;
  /** HANGAR_GPU_MEMORY_MARGIN: what each GPU keeps unbooked, a share of the card or a size in MiB. */
  gpuMemoryMargin: { percent: number } | { mib: number };
  /** HANGAR_CURRENCY: the currency prices are set and costs reported in ("USD"). */
  currency: string;
  /** HANGAR_USAGE_RETENTION: how long usage is kept per minute, hour and day (ms; Infinity: for ever). */
  usageRetention: UsageRetention;
  /**
   * Where /metrics is served without credentials ({host, port}); undefined: on the main port, for an API token.
   */
  metricsListen: { host: string; port: number } | undefined;
  /** Where spans go (OTEL_* variables); undefined: tracing is off and no exporter starts. */
  tracing:
    | { exporter: 'otlp'; url: string; serviceName: string }
    | { exporter: 'console'; serviceName: string }
    | undefined;
};

function hostPort(value: string): { host: string; port: number } {
  const at = value.lastIndexOf(':');
  return { host: value.slice(0, at).replace(/^\[|\]$/g, ''), port: Number(value.slice(at + 1)) };
}

/**
 * Each client address and each caller gets an eighth of the connections by default: one of them hoarding sockets
 * leaves the rest of the server to everybody else, while a site's busy script or an office behind one NAT still
 * has room. Behind a proxy (HANGAR_TRUST_PROXY) every socket comes from the proxy, and the client's address is
 * known only once headers arrive, so the per-address default is then the whole server: limit clients at the proxy.
 */
function connectionShares(
  max: number,
  trustProxy: boolean,
  set: { perAddress: number | undefined; perCaller: number | undefined },
) {
  const eighth = Math.max(1, Math.ceil(max / 8));
  return {
    maxConnectionsPerAddress: Math.min(max, set.perAddress ?? (trustProxy ? max : eighth)),
    maxConnectionsPerCaller: Math.min(max, set.perCaller ?? eighth),
    maxPendingConnections: Math.max(1, Math.floor(max / 4)),
  };
}

export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** Reads the settings from an environment (process.env by default); throws ConfigError naming each bad one. */
export function loadConfig(env: Record<string, string | undefined> = process.env): Config {
  // An empty variable means "unset": `FOO= pnpm start` should fall back to the default, not fail.
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const parsed = schema.safeParse(present);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((issue) => {
      const name = String(issue.path[0] ?? '?');
      return `${name}=${JSON.stringify(present[name] ?? '')} is not accepted: ${issue.message}`;
    });
    throw new ConfigError(`Hangar cannot start: ${lines.join('; ')}`);
  }
  const c = parsed.data;
  const dataDir = path.resolve(c.HANGAR_DATA_DIR);
  return {
    port: c.PORT,
    host: c.HOST,
    dataDir,
    databaseUrl: c.DATABASE_URL,
    dbPoolSizes: { requests: c.HANGAR_DB_POOL_SIZE, loops: c.HANGAR_DB_LOOPS_POOL_SIZE },
    workers: c.HANGAR_WORKERS,
    publicUrl: c.HANGAR_PUBLIC_URL?.replace(/\/+$/, ''),
    adminEmail: c.HANGAR_ADMIN_EMAIL,
    adminPassword: c.HANGAR_ADMIN_PASSWORD,
    // Set and empty is "off", not "unset": `HANGAR_HUB_URL=` in a site's environment file is how people write
    // "no registry here", and falling back to huggingface.co would put back the search box that only times out.
    hubUrl: env.HANGAR_HUB_URL === '' || c.HANGAR_HUB_URL === 'off' ? null : c.HANGAR_HUB_URL.replace(/\/+$/, ''),
    hubToken: c.HANGAR_HUB_TOKEN,
    fetchAllow: c.HANGAR_FETCH_ALLOW,
    configFile: c.HANGAR_CONFIG,
    webDist: path.resolve(c.HANGAR_WEB_DIST ?? new URL('../../web/dist', import.meta.url).pathname),
    sessionHours: c.HANGAR_SESSION_HOURS,
    maxSubscriptionsPerConnection: c.HANGAR_MAX_SUBSCRIPTIONS_PER_CONNECTION,
    maxSubscriptionsPerCaller: c.HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER,
    trustProxy: c.HANGAR_TRUST_PROXY,
    shutdownGraceMs: c.HANGAR_SHUTDOWN_GRACE_MS,
    maxBodyBytes: c.HANGAR_MAX_BODY_BYTES,
    kbDocumentMaxBytes: c.HANGAR_KB_DOCUMENT_MAX_BYTES,
    kbCollectionMaxBytes: c.HANGAR_KB_COLLECTION_MAX_BYTES,
    logLevel: c.HANGAR_LOG_LEVEL,
    corsOrigins: c.HANGAR_CORS_ORIGINS,
    maxConnections: c.HANGAR_MAX_CONNECTIONS,
    ...connectionShares(c.HANGAR_MAX_CONNECTIONS, c.HANGAR_TRUST_PROXY, {
      perAddress: c.HANGAR_MAX_CONNECTIONS_PER_ADDRESS,
      perCaller: c.HANGAR_MAX_CONNECTIONS_PER_CALLER,
    }),
    wsIdleSeconds: c.HANGAR_WS_IDLE_SECONDS,
    headersTimeoutMs: c.HANGAR_HEADERS_TIMEOUT_MS,
    bodyTimeoutMs: c.HANGAR_BODY_TIMEOUT_MS,
    uploadMinBytesPerSecond: c.HANGAR_UPLOAD_MIN_BYTES_PER_SECOND,
    uploadRateWindowMs: c.HANGAR_UPLOAD_RATE_WINDOW_MS,
    graphiql: c.HANGAR_GRAPHIQL,
    mirrorConcurrency: c.HANGAR_MIRROR_CONCURRENCY,
    mirrorStallSeconds: c.HANGAR_MIRROR_STALL_SECONDS,
    mirrorAttempts: c.HANGAR_MIRROR_ATTEMPTS,
    mirrorGiveUpAfterMs: c.HANGAR_MIRROR_GIVE_UP_AFTER,
    mirrorRetryMaxMs: c.HANGAR_MIRROR_RETRY_MAX,
    mirrorBandwidth: c.HANGAR_MIRROR_BANDWIDTH,
    mirrorRequireToken: c.HANGAR_MIRROR_REQUIRE_TOKEN,
    hfPullThrough: c.HANGAR_HF_PULL_THROUGH === 'on',
    mirrorFsync: c.HANGAR_MIRROR_FSYNC,
    mirrorStore: c.HANGAR_MIRROR_STORE,
    s3ForcePathStyle: c.HANGAR_S3_FORCE_PATH_STYLE,
    // Long enough for a node to start a large file, short enough that a URL leaked in a log is soon worthless.
    s3PresignSeconds: c.HANGAR_S3_PRESIGN === 'on' ? 300 : null,
    s3QuotaBytes: c.HANGAR_S3_QUOTA,
    hubTimeoutMs: c.HANGAR_HUB_TIMEOUT_MS,
    llamaCppBuild: c.HANGAR_LLAMACPP_BUILD,
    maxContext: c.HANGAR_MAX_CONTEXT,
    trainLostSeconds: c.HANGAR_TRAIN_LOST_SECONDS,
    gatewayWakeSeconds: c.HANGAR_GATEWAY_WAKE_SECONDS,
    gatewayWakeQueue: c.HANGAR_GATEWAY_WAKE_QUEUE,
    limitMinuteSeconds: c.HANGAR_LIMIT_MINUTE_SECONDS,
    gatewayFirstByteMs: c.HANGAR_GATEWAY_FIRST_BYTE_MS,
    gatewayIdleMs: c.HANGAR_GATEWAY_IDLE_MS,
    gatewayDeadlineSeconds: c.HANGAR_GATEWAY_DEADLINE_SECONDS,
    gatewayLoadFactor: c.HANGAR_GATEWAY_LOAD_FACTOR,
    gatewayRoutesRereadSeconds: c.HANGAR_GATEWAY_ROUTES_REREAD_SECONDS,
    placementRereadSeconds: c.HANGAR_PLACEMENT_REREAD_SECONDS,
    scaleWindowSeconds: c.HANGAR_SCALE_WINDOW_SECONDS,
    drainGraceSeconds: c.HANGAR_DRAIN_GRACE_SECONDS,
    gpuMemoryMargin: c.HANGAR_GPU_MEMORY_MARGIN,
    currency: c.HANGAR_CURRENCY,
    usageRetention: c.HANGAR_USAGE_RETENTION,
    metricsListen: c.HANGAR_METRICS_LISTEN ? hostPort(c.HANGAR_METRICS_LISTEN) : undefined,
    tracing: tracingOf(c),
  };
}

/**
 * The SDK's rules for the endpoint: the traces URL as given, or the base URL with /v1/traces added. An exporter
 * named without an endpoint sends to the collector's default, http://localhost:4318, as the SDK does.
 */
function tracingOf(c: z.infer<typeof schema>): Config['tracing'] {
  const serviceName = c.OTEL_SERVICE_NAME;
  if (c.OTEL_SDK_DISABLED || c.OTEL_TRACES_EXPORTER === 'none') return undefined;
  if (c.OTEL_TRACES_EXPORTER === 'console') return { exporter: 'console', serviceName };
  const named = c.OTEL_TRACES_EXPORTER === 'otlp';
  if (!named && !c.OTEL_EXPORTER_OTLP_ENDPOINT && !c.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return undefined;
  const url =
    c.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ??
    `${(c.OTEL_EXPORTER_OTLP_ENDPOINT ?? 'http://localhost:4318').replace(/\/+$/, '')}/v1/traces`;
  return { exporter: 'otlp', url, serviceName };
}
