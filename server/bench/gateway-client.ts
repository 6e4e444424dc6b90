import http from 'node:http';

// The application's side of bench/gateway.ts, in a process of its own (a real client is elsewhere: parsing its
// answers, and its sockets, must not count in the control plane's CPU or memory). One client for both paths:
// Node's http with a keep-alive agent per origin, so the engine called directly and the gateway in front of it are
// measured by exactly the same code; only the base URL and the bearer key differ.

export type Target = { url: string; key: string };
export type Job =
  | { kind: 'latency'; targets: Target[]; rounds: number }
  | { kind: 'stream'; target: Target; streams: number; tokens: number; ms: number }
  | { kind: 'throughput'; target: Target; connections: number; ms: number }
  | { kind: 'hold'; target: Target; streams: number }
  | { kind: 'release' };
/** Per target, in the order given: each request's time from sending it to the answer's last byte, in ms. */
export type LatencyResult = number[][];
export type StreamResult = { events: number; requests: number; ms: number };
/** Non-streamed requests answered over `connections` kept-alive connections, each sending its next on an answer. */
export type ThroughputResult = { requests: number; ms: number; p50: number };

const agents = new Map<string, http.Agent>();
const agentFor = (origin: string) => {
  let agent = agents.get(origin);
  if (!agent) {
    agent = new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY });
    agents.set(origin, agent);
  }
  return agent;
};

const chat = (o: { stream: boolean; tokens: number; user?: string }) =>
  JSON.stringify({
    model: 'bench',
    messages: [{ role: 'user', content: 'Say hello' }],
    max_tokens: o.tokens,
    ...(o.stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    ...(o.user ? { user: o.user } : {}),
  });

/**
 * One POST to `target`/chat/completions; `onData` sees the answer's bytes as they come. Resolves at the answer's
 * end. A kept-alive socket the server closed just as it was reused is retried once, as Node's docs advise.
 */
function post(
  target: Target,
  body: string,
  onData: (chunk: Buffer) => void,
  opened?: (req: http.ClientRequest) => void,
): Promise<void> {
  const url = new URL(`${target.url}/chat/completions`);
  const attempt = (retry: boolean): Promise<void> =>
    new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: url.hostname,
          port: url.port,
          path: url.pathname,
          method: 'POST',
          agent: agentFor(url.origin),
          headers: {
            authorization: `Bearer ${target.key}`,
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(body),
          },
        },
        (res) => {
          if (res.statusCode !== 200) {
            let text = '';
            res.on('data', (c) => (text += c));
            res.on('end', () => reject(new Error(`${url.href} answered ${res.statusCode}: ${text}`)));
            return;
          }
          res.on('data', onData);
          res.on('end', () => resolve());
          res.on('error', reject);
        },
      );
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (retry && req.reusedSocket && err.code === 'ECONNRESET') resolve(attempt(false));
        else reject(err);
      });
      opened?.(req);
      req.end(body);
    });
  return attempt(true);
}

/** Counts server-sent events (each ends with a blank line) across reads, and keeps the tail to check the end. */
class EventCounter {
  events = 0;
  tail = '';
  private lastWasNewline = false;

  add(chunk: Buffer) {
    if (this.lastWasNewline && chunk[0] === 10) this.events++;
    for (let i = chunk.indexOf('\n\n'); i >= 0; i = chunk.indexOf('\n\n', i + 2)) this.events++;
    this.lastWasNewline = chunk[chunk.length - 1] === 10;
    this.tail = (this.tail + chunk.subarray(-64).toString('latin1')).slice(-64);
  }
}

async function latency(job: Extract<Job, { kind: 'latency' }>): Promise<LatencyResult> {
  const out: LatencyResult = job.targets.map(() => []);
  const body = chat({ stream: false, tokens: 8 });
  const one = async (target: Target) => {
    const started = performance.now();
    let size = 0;
    await post(target, body, (c) => {
      size += c.length;
    });
    if (!size) throw new Error(`${target.url} answered an empty body`);
    return performance.now() - started;
  };
  for (let round = 0; round < job.rounds; round++) {
    // Each goes first in turn: whoever follows meets warmer caches.
    for (let k = 0; k < job.targets.length; k++) {
      const i = (k + round) % job.targets.length;
      out[i]?.push(await one(job.targets[i] as Target));
    }
  }
  return out;
}

async function stream(job: Extract<Job, { kind: 'stream' }>): Promise<StreamResult> {
  const body = chat({ stream: true, tokens: job.tokens });
  // The role chunk, the words, the finish chunk, the usage chunk and [DONE].
  const perRequest = job.tokens + 4;
  let events = 0;
  let requests = 0;
  const started = performance.now();
  const deadline = started + job.ms;
  await Promise.all(
    Array.from({ length: job.streams }, async () => {
      while (performance.now() < deadline) {
        const counter = new EventCounter();
        await post(job.target, body, (c) => counter.add(c));
        if (counter.events !== perRequest || !counter.tail.endsWith('data: [DONE]\n\n')) {
          throw new Error(`${job.target.url}: a stream ended after ${counter.events} of ${perRequest} events`);
        }
        events += counter.events;
        requests++;
      }
    }),
  );
  return { events, requests, ms: performance.now() - started };
}

async function throughput(job: Extract<Job, { kind: 'throughput' }>): Promise<ThroughputResult> {
  const body = chat({ stream: false, tokens: 8 });
  const times: number[] = [];
  const started = performance.now();
  const deadline = started + job.ms;
  await Promise.all(
    Array.from({ length: job.connections }, async () => {
      while (performance.now() < deadline) {
        const at = performance.now();
        await post(job.target, body, () => {});
        times.push(performance.now() - at);
      }
    }),
  );
  times.sort((a, b) => a - b);
  return { requests: times.length, ms: performance.now() - started, p50: times[Math.floor(times.length / 2)] ?? 0 };
}

const heldRequests: http.ClientRequest[] = [];

/** Opens `streams` streams that the engine holds open, resolving once each has brought its first word. */
async function hold(job: Extract<Job, { kind: 'hold' }>): Promise<{ open: number }> {
  const body = chat({ stream: true, tokens: 1, user: 'hold' });
  await Promise.all(
    Array.from(
      { length: job.streams },
      () =>
        new Promise<void>((resolve, reject) => {
          const counter = new EventCounter();
          post(
            job.target,
            body,
            (c) => {
              counter.add(c);
              if (counter.events === 2) resolve();
            },
            (req) => heldRequests.push(req),
          ).then(() => reject(new Error(`a held stream ended (${counter.events} events)`)), reject);
        }),
    ),
  );
  return { open: heldRequests.length };
}

process.on('message', async (job: Job) => {
  try {
    if (job.kind === 'latency') process.send?.({ ok: await latency(job) });
    else if (job.kind === 'stream') process.send?.({ ok: await stream(job) });
    else if (job.kind === 'throughput') process.send?.({ ok: await throughput(job) });
    else if (job.kind === 'hold') process.send?.({ ok: await hold(job) });
    else {
      // Going away is how a held stream ends: the gateway must abort the engine's side at once.
      for (const req of heldRequests.splice(0)) req.destroy();
      process.send?.({ ok: true });
    }
  } catch (err) {
    process.send?.({ error: (err as Error).stack ?? String(err) });
  }
});
process.on('disconnect', () => process.exit(0));
process.send?.({ ready: true });
