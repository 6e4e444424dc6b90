import http from 'node:http';
import type { AddressInfo } from 'node:net';

// The stand-in OpenAI engine of bench/gateway.ts, in a process of its own (a real engine is on another machine,
// and its sockets must not count in the control plane's memory): POST /v1/chat/completions answered at once with
// fixed words, so what is measured is the path, not generation. Non-streaming: one chat.completion with usage.
// Streaming: `max_tokens` chunks, each written in its own turn of the event loop (one write per token, as an
// engine sends them, not one coalesced buffer), the usage chunk when stream_options.include_usage, `[DONE]`.
// A request with `"user": "hold"` streams one word and then holds the stream open until its client goes away:
// the open streams of the memory measurement.
//
// The engine key comes in HANGAR_BENCH_ENGINE_KEY; the bound endpoint goes back to the parent over IPC, and
// {count: 'held'} is answered with how many streams it holds now.

const key = process.env.HANGAR_BENCH_ENGINE_KEY ?? '';
let held = 0;

const server = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    if (req.method !== 'POST' || req.url !== '/v1/chat/completions') {
      return error(res, 404, `no route ${req.method} ${req.url}: this stand-in answers POST /v1/chat/completions`);
    }
    if (req.headers.authorization !== `Bearer ${key}`) return error(res, 401, 'Incorrect API key provided.');
    let body: {
      model?: string;
      stream?: boolean;
      max_tokens?: number;
      user?: string;
      stream_options?: { include_usage?: boolean };
    };
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      return error(res, 400, 'the body is not JSON');
    }
    const model = body.model ?? 'bench';
    const tokens = Math.max(1, Math.min(100_000, body.max_tokens ?? 8));
    if (!body.stream) {
      const text = JSON.stringify({
        id: 'chatcmpl-bench',
        object: 'chat.completion',
        created: 1,
        model,
        choices: [{ index: 0, message: { role: 'assistant', content: 'Hello there!' }, finish_reason: 'stop' }],
        usage: { prompt_tokens: 4, completion_tokens: 3, total_tokens: 7 },
      });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      return res.end(text);
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const head = `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":${JSON.stringify(model)},"choices":[`;
    const word = `${head}{"index":0,"delta":{"content":" word"},"finish_reason":null}]}\n\n`;
    res.write(`${head}{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n`);
    if (body.user === 'hold') {
      res.write(word);
      held++;
      res.once('close', () => held--);
      return;
    }
    let sent = 0;
    const next = () => {
      if (res.destroyed) return;
      if (sent < tokens) {
        sent++;
        // Backpressure as an engine honours it: a client (or gateway) that reads slowly slows the engine.
        if (res.write(word)) setImmediate(next);
        else res.once('drain', next);
        return;
      }
      res.write(`${head}{"index":0,"delta":{},"finish_reason":"length"}]}\n\n`);
      if (body.stream_options?.include_usage) {
        res.write(
          `${head}],"usage":{"prompt_tokens":4,"completion_tokens":${tokens},"total_tokens":${tokens + 4}}}\n\n`,
        );
      }
      res.end('data: [DONE]\n\n');
    };
    setImmediate(next);
  });
});

function error(res: http.ServerResponse, status: number, message: string) {
  const text = JSON.stringify({ error: { message, type: 'invalid_request_error', param: null, code: null } });
  res.writeHead(status, { 'content-type': 'application/json' }).end(text);
}

server.listen(0, '127.0.0.1', () => {
  const { port } = server.address() as AddressInfo;
  process.send?.({ endpoint: `http://127.0.0.1:${port}/v1` });
});
process.on('message', (m: { count?: string }) => {
  if (m.count === 'held') process.send?.({ held });
});
process.on('disconnect', () => process.exit(0));
