import os from 'node:os';
import { parseAllowEntry } from '@hangar/common/outbound';
import { z } from 'zod';
import { DEFAULT_USAGE_RETENTION, parseUsageRetention } from './gateway/usage-retention-setting.js';
import { parseQuota } from './mirror/bucket-space.js';
import { parseStoreSpec } from './mirror/store/store.js';

// What each environment variable accepts, as one zod schema: the rules and messages, none of the reading.
// config.ts holds the only read of process.env and shapes the parsed values into Config.

const port = z.coerce
  .number({ error: 'a port number' })
  .int('a whole number')
  .min(0, 'from 0 to 65535')
  .max(65535, 'from 0 to 65535');

const httpUrl = z
  .string()
  .url('an absolute URL such as https://hangar.example.com')
  .refine((u) => /^https?:\/\//.test(u), 'an http:// or https:// URL');

/** An origin exactly as a browser sends it in Origin: http(s)://host[:port], nothing after. */
function isOrigin(value: string): boolean {
  try {
    const u = new URL(value);
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.origin === value;
  } catch {
    return false;
  }
}

const bool = z.enum(['true', 'false', '1', '0']).transform((v) => v === 'true' || v === '1');

const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** A duration as people write it ("90s", "30m", "6h", "1h30m"; a bare number is seconds), in milliseconds. */
const duration = (example: string) =>
  z.string().transform((v, ctx) => {
    const text = v.trim().toLowerCase();
    const parts = [...text.matchAll(/(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)/g)];
    const whole = /^\d+(\.\d+)?$/.test(text);
    if (!whole && (parts.length === 0 || parts.map((p) => p[0]).join('') !== text.replace(/\s+/g, ''))) {
      ctx.addIssue({
        code: 'custom',
        message: `a duration such as ${example}: a number with s, m, h or d (a bare number is seconds)`,
      });
      return z.NEVER;
    }
    return whole
      ? Number(text) * 1000
      : parts.reduce((n, p) => n + Number(p[1]) * (DURATION_UNITS[p[2] as string] ?? 0), 0);
  });

const RATE_UNITS: Record<string, number> = {
  b: 1,
  kb: 1e3,
  mb: 1e6,
  gb: 1e9,
  kib: 1024,
  mib: 1024 ** 2,
  gib: 1024 ** 3,
};

/** A rate as "50MB/s", "800KiB/s" or plain bytes per second; "0" or "off" is no limit (null). */
export function parseRate(v: string): number | null | string {
  const text = v.trim().toLowerCase().replace(/\s+/g, '');
  if (text === '0' || text === 'off' || text === 'none') return null;
  const m = /^(\d+(?:\.\d+)?)(b|kb|mb|gb|kib|mib|gib)?(?:\/s|ps)?$/.exec(text);
  if (!m) return 'a rate such as 50MB/s, 800KiB/s or 1000000 (bytes per second); 0 or off for no limit';
  const bytes = Math.floor(Number(m[1]) * (RATE_UNITS[m[2] ?? 'b'] ?? 1));
  // Slower than this, each 64 KiB the limit lets through would wait long enough to look like a stall.
  if (bytes < 65_536) return `at least 64KiB/s (65536 bytes per second): ${v} is ${bytes} bytes per second`;
  return bytes;
}

/**
 * HANGAR_GPU_MEMORY_MARGIN: a share of each card ("10%") or a size ("512MiB", "1GiB"), as a function of the card's
 * total MiB giving the MiB kept unbooked on it.
 */
const gpuMemoryMargin = z.string().transform((v, ctx) => {
  const text = v.trim().toLowerCase().replace(/\s+/g, '');
  const pct = /^(\d+(?:\.\d+)?)%$/.exec(text);
  if (pct && Number(pct[1]) < 90) return { percent: Number(pct[1]) };
  const size = /^(\d+(?:\.\d+)?)(mib|gib)$/.exec(text);
  if (size) return { mib: Number(size[1]) * (size[2] === 'gib' ? 1024 : 1) };
  ctx.addIssue({
    code: 'custom',
    message: 'a share of each card below 90% ("10%") or a size in MiB or GiB ("512MiB", "1GiB")',
  });
  return z.NEVER;
});

export const schema = z.object({
  PORT: port.default(4000),
  HOST: z.string().min(1, 'a host name or address, such as 127.0.0.1').default('127.0.0.1'),
  HANGAR_DATA_DIR: z.string().min(1, 'a directory path').default('./data'),
  DATABASE_URL: z
    .string()
    .refine((u) => /^postgres(ql)?:\/\//.test(u), 'a postgres:// or postgresql:// connection URL')
    .optional(),
  // Connections each process may open to PostgreSQL, per pool (db/client.ts). Two at least: one request (or loop)
  // holding a transaction must leave a connection for the next.
  HANGAR_DB_POOL_SIZE: z.coerce
    .number({ error: 'a number of connections' })
    .int('a whole number of connections')
    .min(2, 'at least 2')
    .max(1000, 'at most 1000')
    .default(20),
  HANGAR_DB_LOOPS_POOL_SIZE: z.coerce
    .number({ error: 'a number of connections' })
    .int('a whole number of connections')
    .min(2, 'at least 2')
    .max(1000, 'at most 1000')
    .default(10),
  // Processes that serve on the port (serve/workers.ts): 1 is one process, as always; auto, one per core.
  HANGAR_WORKERS: z
    .string()
    .default('1')
    .transform((v, ctx) => {
      const text = v.trim().toLowerCase();
      if (text === 'auto') return os.availableParallelism();
      if (/^\d+$/.test(text) && Number(text) >= 1 && Number(text) <= 256) return Number(text);
      ctx.addIssue({
        code: 'custom',
        message:
          'a number of server processes from 1 to 256, or auto for one per CPU core (os.availableParallelism()); 1 is a single process',
      });
      return z.NEVER;
    }),
  HANGAR_PUBLIC_URL: httpUrl.optional(),
  HANGAR_ADMIN_EMAIL: z.string().email('an email address such as admin@example.com').optional(),
  HANGAR_ADMIN_PASSWORD: z.string().min(12, 'at least 12 characters').optional(),
  // "off" turns the registry explorer off (an air-gapped site: a search box that can only time out is worse than
  // none). An empty value is off too, unlike the other variables: see loadConfig.
  HANGAR_HUB_URL: z
    .string()
    .refine(
      (v) => v === 'off' || httpUrl.safeParse(v).success,
      "the registry's http:// or https:// URL, such as https://huggingface.co, or off to turn the explorer off",
    )
    .default('https://huggingface.co'),
  HANGAR_HUB_TOKEN: z.string().optional(),
  HANGAR_FETCH_ALLOW: z
    .string()
    .transform((v) =>
      v
        .split(',')
        .map((e) => e.trim())
        .filter(Boolean),
    )
    .superRefine((entries, ctx) => {
      for (const e of entries) {
        const parsed = parseAllowEntry(e);
        if (typeof parsed === 'string')
          ctx.addIssue({ code: 'custom', message: `a comma-separated list of host names and networks: ${parsed}` });
      }
    })
    .default([]),
  HANGAR_CONFIG: z.string().optional(),
  HANGAR_WEB_DIST: z.string().optional(),
  HANGAR_SESSION_HOURS: z.coerce
    .number()
    .int()
    .min(1, 'at least 1')
    .max(24 * 90, 'at most 2160 (90 days)')
    .default(168),
  HANGAR_MAX_SUBSCRIPTIONS_PER_CONNECTION: z.coerce
    .number()
    .int('a whole number')
    .min(1, 'at least 1')
    .max(100_000, 'at most 100000')
    .default(100),
  HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER: z.coerce
    .number()
    .int('a whole number')
    .min(1, 'at least 1')
    .max(1_000_000, 'at most 1000000')
    .default(500),
  HANGAR_TRUST_PROXY: bool.default(false),
  HANGAR_SHUTDOWN_GRACE_MS: z.coerce.number().int().min(0).max(600_000, 'at most 600000').default(10_000),
  HANGAR_MAX_BODY_BYTES: z.coerce
    .number()
    .int()
    .min(1024, 'at least 1024')
    .default(1 << 20),
  // A document arrives base64-encoded in one /graphql request (4 bytes for every 3), so the default fits the
  // default HANGAR_MAX_BODY_BYTES; raise both together.
  HANGAR_KB_DOCUMENT_MAX_BYTES: z.coerce
    .number()
    .int('a whole number of bytes')
    .min(1, 'at least 1')
    .default(512 * 1024),
  HANGAR_KB_COLLECTION_MAX_BYTES: z.coerce
    .number()
    .int('a whole number of bytes')
    .min(1, 'at least 1')
    .default(64 * 1024 * 1024),
  HANGAR_CORS_ORIGINS: z
    .string()
    .transform((v) =>
      v
        .split(',')
        .map((e) => e.trim())
        .filter(Boolean),
    )
    .superRefine((origins, ctx) => {
      for (const o of origins) {
        if (!isOrigin(o)) {
          ctx.addIssue({
            code: 'custom',
            message: `a comma-separated list of origins (scheme, host and port, no path), such as https://tools.example.com: "${o}" is not one`,
          });
        }
      }
    })
    .default([]),
  HANGAR_MAX_CONNECTIONS: z.coerce
    .number()
    .int('a whole number')
    .min(1, 'at least 1')
    .max(1_000_000, 'at most 1000000')
    .default(1024),
  // Unset, both are worked out from HANGAR_MAX_CONNECTIONS (config.ts says how).
  HANGAR_MAX_CONNECTIONS_PER_ADDRESS: z.coerce
    .number()
    .int('a whole number')
    .min(1, 'at least 1')
    .max(1_000_000, 'at most 1000000')
    .optional(),
  HANGAR_MAX_CONNECTIONS_PER_CALLER: z.coerce
    .number()
    .int('a whole number')
    .min(1, 'at least 1')
    .max(1_000_000, 'at most 1000000')
    .optional(),
  HANGAR_WS_IDLE_SECONDS: z.coerce
    .number()
    .int('a whole number of seconds')
    .min(1, 'at least 1')
    .max(86_400, 'at most 86400 (a day)')
    .default(60),
  HANGAR_HEADERS_TIMEOUT_MS: z.coerce
    .number()
    .int()
    .min(100, 'at least 100')
    .max(600_000, 'at most 600000')
    .default(20_000),
  HANGAR_BODY_TIMEOUT_MS: z.coerce
    .number()
    .int()
    .min(100, 'at least 100')
    .max(600_000, 'at most 600000')
    .default(30_000),
  HANGAR_UPLOAD_MIN_BYTES_PER_SECOND: z.coerce.number().int().min(1, 'at least 1').default(4096),
  HANGAR_UPLOAD_RATE_WINDOW_MS: z.coerce
    .number()
    .int()
    .min(100, 'at least 100')
    .max(3_600_000, 'at most 3600000')
    .default(30_000),
  HANGAR_LOG_LEVEL: z.enum(['debug', 'info', 'warn', 'error', 'silent']).default('info'),
  HANGAR_GRAPHIQL: bool.default(true),
  HANGAR_MIRROR_CONCURRENCY: z.coerce.number().int().min(1, 'at least 1').max(64, 'at most 64').default(3),
  HANGAR_MIRROR_STALL_SECONDS: z.coerce.number().int().min(1, 'at least 1').max(3600, 'at most 3600').default(30),
  HANGAR_MIRROR_ATTEMPTS: z.coerce.number().int().min(1, 'at least 1').max(100, 'at most 100').default(8),
  HANGAR_MIRROR_GIVE_UP_AFTER: duration('6h or 90m')
    .refine((ms) => ms >= 1000 && ms <= 30 * 86_400_000, 'from 1s to 30d')
    .default(6 * 3_600_000),
  HANGAR_MIRROR_RETRY_MAX: duration('60s or 2m')
    .refine((ms) => ms >= 10 && ms <= 3_600_000, 'from 10ms to 1h')
    .default(60_000),
  HANGAR_MIRROR_BANDWIDTH: z
    .string()
    .transform((v, ctx) => {
      const r = parseRate(v);
      if (typeof r === 'string') {
        ctx.addIssue({ code: 'custom', message: r });
        return z.NEVER;
      }
      return r;
    })
    .default(null),
  // On by default: a node token or an API token is cheap to hand out, and a server on 0.0.0.0 serving weights to
  // anyone who can reach the port is not. The console (its session), nodes and the server itself all send one.
  HANGAR_MIRROR_REQUIRE_TOKEN: bool.default(true),
  // Off by default: on, a request under /hf for what the mirror lacks downloads it from HANGAR_HUB_URL, which is
  // disk and egress spent at a client's word (see hf/pull-through.ts for who may ask).
  HANGAR_HF_PULL_THROUGH: z
    .enum(['off', 'on'], { message: 'off or on: whether /hf fetches what the mirror lacks from HANGAR_HUB_URL' })
    .default('off'),
  HANGAR_MIRROR_FSYNC: bool.default(false),
  // Where the mirror's bytes live: `file` (under HANGAR_DATA_DIR, the default) or `s3://bucket/prefix`, an
  // S3-compatible bucket that replicas share (mirror/store/). Credentials, region and endpoint come from the AWS
  // SDK's own variables (AWS_ACCESS_KEY_ID, AWS_REGION, AWS_ENDPOINT_URL, AWS_PROFILE…).
  HANGAR_MIRROR_STORE: z
    .string()
    .default('file')
    .transform((v, ctx) => {
      try {
        return parseStoreSpec(v);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
        return z.NEVER;
      }
    }),
  // MinIO and Ceph RGW are often reached with the bucket in the path rather than in the host name.
  HANGAR_S3_FORCE_PATH_STYLE: bool.default(false),
  // On: /mirror answers a node with a 302 to a short-lived presigned URL on the bucket, after the owners' rules.
  HANGAR_S3_PRESIGN: z
    .enum(['off', 'on'], { message: 'off or on: whether /mirror sends nodes to a presigned URL on the bucket' })
    .default('off'),
  // What the mirror may keep in the bucket (mirror/bucket-space.ts): a fetch that would pass it is refused first.
  HANGAR_S3_QUOTA: z
    .string()
    .default('off')
    .transform((v, ctx) => {
      const q = parseQuota(v);
      if (typeof q === 'string') {
        ctx.addIssue({ code: 'custom', message: q });
        return z.NEVER;
      }
      return q;
    }),
  HANGAR_HUB_TIMEOUT_MS: z.coerce
    .number()
    .int()
    .min(100, 'at least 100')
    .max(600_000, 'at most 600000')
    .default(15_000),
  HANGAR_LLAMACPP_BUILD: z.coerce.number().int().min(1, 'a llama.cpp build number such as 4748').optional(),
  HANGAR_TRAIN_LOST_SECONDS: z.coerce.number().int().min(5, 'at least 5').max(86_400, 'at most 86400').default(120),
  HANGAR_MAX_CONTEXT: z.coerce
    .number()
    .int()
    .min(256, 'at least 256')
    .max(4_194_304, 'at most 4194304')
    .default(32_768),
  HANGAR_GATEWAY_WAKE_SECONDS: z.coerce.number().int().min(0, 'at least 0').max(3600, 'at most 3600').default(120),
  HANGAR_GATEWAY_WAKE_QUEUE: z.coerce.number().int().min(0, 'at least 0').max(100_000, 'at most 100000').default(64),
  // A test's short "minute", so a client's retry after a per-minute limit's reset can be watched; sites keep 60.
  HANGAR_LIMIT_MINUTE_SECONDS: z.coerce.number().int().min(1, 'at least 1').max(60, 'at most 60').default(60),
  // host:port of a second listener that serves only /metrics, without credentials (a network the site controls);
  // unset, /metrics is on the main port and needs an API token.
  HANGAR_METRICS_LISTEN: z
    .string()
    .regex(/^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}$/, 'host:port, such as 127.0.0.1:9464')
    .refine((v) => Number(v.slice(v.lastIndexOf(':') + 1)) <= 65_535, 'a port from 0 to 65535')
    .optional(),
  HANGAR_GATEWAY_FIRST_BYTE_MS: z.coerce
    .number()
    .int()
    .min(100, 'at least 100')
    .max(3_600_000, 'at most 3600000')
    .default(120_000),
  HANGAR_GATEWAY_IDLE_MS: z.coerce
    .number()
    .int()
    .min(100, 'at least 100')
    .max(3_600_000, 'at most 3600000')
    .default(120_000),
  HANGAR_GATEWAY_DEADLINE_SECONDS: z.coerce
    .number()
    .int()
    .min(1, 'at least 1')
    .max(86_400, 'at most 86400')
    .default(1800),
  // How far above the mean in-flight count the replica a prefix or session names may go before the next one on the
  // ring takes the request (consistent hashing with bounded loads): lower spreads sooner, higher keeps caches warmer.
  HANGAR_GATEWAY_LOAD_FACTOR: z.coerce.number().min(1, 'at least 1').max(10, 'at most 10').default(1.25),
  HANGAR_GATEWAY_ROUTES_REREAD_SECONDS: z.coerce
    .number()
    .int()
    .min(1, 'at least 1')
    .max(86_400, 'at most 86400')
    .default(60),
  // The placement pass runs when the catalog's events, the nodes online or time say its answer may have changed;
  // besides, this often, as a safety net (fleet/placement-schedule.ts).
  HANGAR_PLACEMENT_REREAD_SECONDS: z.coerce
    .number()
    .int()
    .min(1, 'at least 1')
    .max(86_400, 'at most 86400')
    .default(60),
  // How long a model's load must stay above (or below) its target before a replica is added (or removed): one busy
  // minute adds capacity, a burst of seconds does not start a replica that takes longer than that to load.
  HANGAR_SCALE_WINDOW_SECONDS: z.coerce.number().min(0.5, 'at least 0.5').max(86_400, 'at most 86400').default(60),
  // How long a replica being removed keeps answering the requests it already has, taking no new ones, before it is
  // stopped anyway: a long generation finishes rather than being cut by a scale-down.
  HANGAR_DRAIN_GRACE_SECONDS: z.coerce.number().int().min(0, '0 or more').max(86_400, 'at most 86400').default(120),
  // GPU memory each card keeps unbooked when placement counts what its replicas hold: the plan's estimate is an
  // estimate, and CUDA's own buffers grow with load; a card booked to the last MiB fails its next load.
  HANGAR_GPU_MEMORY_MARGIN: z.string().default('10%').pipe(gpuMemoryMargin),
  // How long usage is kept per minute, per hour and per day (gateway/usage-retention-setting.ts).
  HANGAR_USAGE_RETENTION: z
    .string()
    .default(DEFAULT_USAGE_RETENTION)
    .transform((v, ctx) => {
      const r = parseUsageRetention(v);
      if (typeof r === 'string') {
        ctx.addIssue({ code: 'custom', message: r });
        return z.NEVER;
      }
      return r;
    }),
  // The currency prices and costs are in (governance/cost.service.ts): a code people read, not converted to anything.
  HANGAR_CURRENCY: z
    .string()
    .regex(/^[A-Z]{3}$/, 'a three-letter currency code in capitals, as ISO 4217 writes it (USD, EUR, CHF)')
    .default('USD'),
  // OpenTelemetry's own variables, read as its SDKs read them, so a site's collector settings carry over. Off
  // unless an OTLP endpoint or exporter is named: a server must not start sending spans to a default address.
  OTEL_SDK_DISABLED: bool.default(false),
  OTEL_TRACES_EXPORTER: z
    .enum(['otlp', 'console', 'none'], { message: 'otlp, console or none (one exporter; Hangar sends OTLP over HTTP)' })
    .optional(),
  OTEL_EXPORTER_OTLP_ENDPOINT: z.url({ message: 'an http(s) URL, such as http://collector:4318' }).optional(),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: z
    .url({ message: 'an http(s) URL, such as http://collector:4318/v1/traces' })
    .optional(),
  OTEL_SERVICE_NAME: z.string().default('hangar'),
});
