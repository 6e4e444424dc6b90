import http from 'node:http';
import { openAiClient } from '@hangar/common/test/fixtures/openai-client';

// The application's side of bench/serving.ts, in a process of its own (forked, asked over IPC): a real client is
// another process on another machine, and parsing its stream in the server's process would bill the endpoint for
// the client.

type Job = {
  clients: number;
  requests: number;
  prompt: string;
  maxTokens: number;
  /** openai: the official client; raw: Node's http reading the same stream, to tell the client's cost apart. */
  via: 'openai' | 'raw';
};
const url = process.env.HANGAR_BENCH_URL as string;
const key = process.env.HANGAR_BENCH_KEY as string;
const client = openAiClient(url, key);

const agent = new http.Agent({ keepAlive: true });

/** The same streamed request through Node's http; the usage is the `data:` event before `[DONE]`. */
function raw(job: Job): Promise<number> {
  const body = JSON.stringify({
    model: 'tiny',
    prompt: job.prompt,
    max_tokens: job.maxTokens,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  const u = new URL(`${url}/v1/completions`);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname,
        method: 'POST',
        agent,
        headers: {
          authorization: `Bearer ${key}`,
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(body),
        },
      },
      (res) => {
        let tail = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => {
          tail = (tail + c).slice(-4096);
        });
        res.on('end', () => {
          const events = tail.split('\n\n').filter((e) => e.startsWith('data: {'));
          const last = JSON.parse(events.at(-1)?.slice(6) ?? '{}');
          resolve(last.usage?.completion_tokens ?? 0);
        });
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function one(job: Job): Promise<number> {
  if (job.via === 'raw') return raw(job);
  const stream = await client.completions.create({
    model: 'tiny',
    prompt: job.prompt,
    max_tokens: job.maxTokens,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let tokens = 0;
  for await (const chunk of stream) if (chunk.usage) tokens = chunk.usage.completion_tokens;
  return tokens;
}

process.on('message', async (job: Job) => {
  const started = performance.now();
  const counts = await Promise.all(
    Array.from({ length: job.clients }, async () => {
      let n = 0;
      for (let i = 0; i < job.requests; i++) n += await one(job);
      return n;
    }),
  );
  const tokens = counts.reduce((a, b) => a + b, 0);
  process.send?.((tokens * 1000) / (performance.now() - started));
});
