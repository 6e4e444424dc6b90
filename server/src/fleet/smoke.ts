import net from 'node:net';

// The control plane's smoke test of a replica: one short chat request through the replica's own endpoint with
// its engine key, exactly as the gateway will send requests, so READY means "a request reaches it and it
// answers", not "the agent says it loaded". Through the official OpenAI client: what an application would see.

// The OpenAI client is imported at the first smoke test, not at the server's start: a quarter of a second of
// every start (bench/start.ts) and 10 MiB of an idle process, for a server that may have no node yet.
type OpenAIModule = typeof import('openai');
let openai: Promise<OpenAIModule> | undefined;

export type SmokeInput = {
  /** The replica's OpenAI base URL, as its agent advertised it (…/v1). */
  endpoint: string;
  engineKey: string;
  /** The catalog name: what requests ask for (OpenAI's `model`). */
  model: string;
  /** The whole request, connection to last token; a replica that takes longer is not ready. */
  timeoutMs?: number;
  signal?: AbortSignal;
};

export type SmokeResult =
  | {
      ok: true;
      text: string;
      completionTokens: number;
      /** Generation speed after the first token (the first includes reading the prompt), tokens per second. */
      tokensPerSecond: number;
      /** From sending the request to the first piece of the answer, in milliseconds. */
      timeToFirstTokenMs: number;
    }
  | { ok: false; reason: string };

export const SMOKE_MAX_TOKENS = 8;
const SMOKE_TIMEOUT_MS = 60_000;

/**
 * Why an endpoint an agent reported cannot be used, or null. Private and loopback addresses are what nodes have
 * (and an agent on the server's own machine); an address no node answers on is refused, so a node token cannot
 * point the control plane's requests at a cloud's metadata service (169.254.169.254) or a multicast group.
 */
export function endpointProblem(endpoint: string): string | null {
  let u: URL;
  try {
    u = new URL(endpoint);
  } catch {
    return `${JSON.stringify(endpoint.slice(0, 200))} is not a URL: an agent advertises http://host:port/v1`;
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return 'an endpoint is an http:// or https:// URL';
  if (u.username || u.password) return 'an endpoint has no user:password@: the engine key is sent as the bearer';
  if (u.search || u.hash) return 'an endpoint has no ?query or #fragment';
  if (!/\/v1\/?$/.test(u.pathname)) return `an endpoint is the OpenAI base URL, ending /v1 (not ${u.pathname})`;
  const host = u.hostname.replace(/^\[|\]$/g, '');
  if (net.isIP(host)) {
    const list = new net.BlockList();
    list.addSubnet('0.0.0.0', 8, 'ipv4');
    list.addSubnet('169.254.0.0', 16, 'ipv4');
    list.addSubnet('224.0.0.0', 3, 'ipv4');
    list.addAddress('::', 'ipv6');
    list.addSubnet('fe80::', 10, 'ipv6');
    list.addSubnet('ff00::', 8, 'ipv6');
    if (list.check(host, net.isIPv6(host) ? 'ipv6' : 'ipv4'))
      return `${host} is an unspecified, link-local or multicast address, which no node serves on: set HANGAR_AGENT_ADVERTISE_URL on the node`;
  }
  return null;
}

/** One short chat request, streamed so the first token's time is seen. Never throws; never says the key. */
export async function smokeTest(input: SmokeInput): Promise<SmokeResult> {
  const base = input.endpoint.replace(/\/+$/, '');
  openai ??= import('openai');
  const sdk = await openai;
  const client = new sdk.default({
    baseURL: base,
    apiKey: input.engineKey,
    // Once: a replica that does not answer now is not ready, and the caller tries again later if it wants.
    maxRetries: 0,
    timeout: input.timeoutMs ?? SMOKE_TIMEOUT_MS,
    // A redirect would carry the engine key to wherever it points.
    fetchOptions: { redirect: 'error' },
  });
  const started = performance.now();
  let first: number | undefined;
  let text = '';
  let pieces = 0;
  let usageTokens: number | undefined;
  try {
    const stream = await client.chat.completions.create(
      {
        model: input.model,
        messages: [{ role: 'user', content: 'Say hello.' }],
        max_tokens: SMOKE_MAX_TOKENS,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
      },
      { signal: input.signal },
    );
    for await (const chunk of stream) {
      const piece = chunk.choices[0]?.delta?.content;
      if (piece) {
        first ??= performance.now();
        text += piece;
        pieces++;
      }
      if (chunk.usage) usageTokens = chunk.usage.completion_tokens;
    }
  } catch (err) {
    return { ok: false, reason: hideKey(reasonOf(sdk, err, base), input.engineKey) };
  }
  const ended = performance.now();
  const tokens = usageTokens ?? pieces;
  const firstAt = first ?? ended;
  const decodeMs = ended - firstAt;
  const tokensPerSecond =
    tokens > 1 && decodeMs > 0
      ? ((tokens - 1) * 1000) / decodeMs
      : tokens > 0
        ? (tokens * 1000) / (ended - started)
        : 0;
  return {
    ok: true,
    text,
    completionTokens: tokens,
    tokensPerSecond: Math.round(tokensPerSecond * 100) / 100,
    timeToFirstTokenMs: Math.round((firstAt - started) * 10) / 10,
  };
}

function reasonOf(
  { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError }: OpenAIModule,
  err: unknown,
  base: string,
): string {
  const at = `${base}/chat/completions`;
  if (err instanceof APIUserAbortError) return 'the smoke test was stopped';
  if (err instanceof APIConnectionTimeoutError) return `${at} did not answer in time`;
  if (err instanceof APIConnectionError) {
    const cause = (err as { cause?: { code?: string; message?: string; cause?: { code?: string } } }).cause;
    const code = cause?.cause?.code ?? cause?.code ?? cause?.message ?? err.message;
    return `could not reach ${at} (${code}): is the agent's HANGAR_AGENT_LISTEN reachable from the control plane, and HANGAR_AGENT_ADVERTISE_URL its address?`;
  }
  if (err instanceof APIError) {
    const said = clip(err.error && typeof err.error === 'object' ? (err.error as { message?: unknown }).message : '');
    if (err.status === 401 || err.status === 403)
      return `${at} refused the engine key (HTTP ${err.status}${said ? `: ${said}` : ''}): the agent and the control plane disagree on it; the replica must be started again`;
    return `${at} answered HTTP ${err.status ?? '?'}${said ? `: ${said}` : ''}`;
  }
  return `the smoke test through ${at} failed: ${clip((err as Error)?.message ?? String(err))}`;
}

function clip(s: unknown): string {
  const t = typeof s === 'string' ? s : '';
  return t.length > 300 ? `${t.slice(0, 299)}…` : t;
}

/** An engine that echoes the key in an error (OpenAI's own does, partly) must not get it into a message. */
function hideKey(reason: string, key: string): string {
  return key ? reason.split(key).join('(the engine key)') : reason;
}
