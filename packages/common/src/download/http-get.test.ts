import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bytes } from '../../test/fixtures/fault-upstream.js';
import { type GetResponse, httpGet } from './http-get.js';

// The download client against real servers on real sockets: Node's own http and https servers for the ordinary
// cases, and a raw TCP server for what a well-behaved server never sends (a head a byte at a time, a body that
// ends with the connection, a cut).

const closers: (() => void)[] = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const sockets = new Set<net.Socket>();
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  closers.push(() => {
    for (const s of sockets) s.destroy();
    server.close();
  });
  return (server.address() as net.AddressInfo).port;
}

/** A server that writes what `answer` says to the socket, whatever the request. */
async function raw(answer: (socket: net.Socket) => void): Promise<string> {
  const port = await listen(net.createServer((s) => s.once('data', () => answer(s))));
  return `http://127.0.0.1:${port}/file`;
}

const signal = () => new AbortController().signal;

/** Reads a whole body through the sink, keeping a copy of every block. */
async function collect(res: GetResponse): Promise<{ body: Buffer; blocks: number[] }> {
  const parts: Buffer[] = [];
  await res.readBody(async (block) => {
    parts.push(Buffer.from(block));
  });
  return { body: Buffer.concat(parts), blocks: parts.map((p) => p.length) };
}

describe('the download client', () => {
  it('reads a body of known length in blocks of at most 4 MiB, with the headers', async () => {
    const body = bytes(10 * 1024 * 1024 + 123, 1);
    const port = await listen(
      http.createServer((_, res) => res.writeHead(200, { 'content-length': body.length, etag: '"v1"' }).end(body)),
    );
    const res = await httpGet(`http://127.0.0.1:${port}/f`, { headers: {}, signal: signal() });
    expect(res.status).toBe(200);
    expect(res.headers.get('etag')).toBe('"v1"');
    const got = await collect(res);
    expect(got.body.equals(body)).toBe(true);
    expect(Math.max(...got.blocks)).toBeLessThanOrEqual(4 * 1024 * 1024);
  });

  it('sends the request line and headers it was given, and asks to close the connection', async () => {
    let seen: http.IncomingHttpHeaders = {};
    let url = '';
    const port = await listen(
      http.createServer((req, res) => {
        seen = req.headers;
        url = req.url ?? '';
        res.end('ok');
      }),
    );
    const res = await httpGet(`http://127.0.0.1:${port}/a%20b/c?x=1`, {
      headers: { range: 'bytes=5-', authorization: 'Bearer t' },
      signal: signal(),
    });
    expect((await collect(res)).body.toString()).toBe('ok');
    expect(url).toBe('/a%20b/c?x=1');
    expect(seen).toMatchObject({
      host: `127.0.0.1:${port}`,
      range: 'bytes=5-',
      authorization: 'Bearer t',
      connection: 'close',
    });
  });

  it('refuses a header value that holds a line break, sending nothing', async () => {
    let connections = 0;
    const port = await listen(net.createServer(() => connections++));
    await expect(
      httpGet(`http://127.0.0.1:${port}/f`, { headers: { 'x-a': 'b\r\nx-evil: 1' }, signal: signal() }),
    ).rejects.toThrow('the header x-a holds a line break');
    expect(connections).toBe(0);
  });

  it('undoes chunked framing', async () => {
    const body = bytes(3 * 1024 * 1024, 2);
    const port = await listen(
      http.createServer((_, res) => {
        res.writeHead(200); // no Content-Length: Node's server sends it chunked
        for (let at = 0; at < body.length; at += 100_000) res.write(body.subarray(at, at + 100_000));
        res.end();
      }),
    );
    const res = await httpGet(`http://127.0.0.1:${port}/f`, { headers: {}, signal: signal() });
    expect(res.headers.get('transfer-encoding')).toBe('chunked');
    expect((await collect(res)).body.equals(body)).toBe(true);
  });

  it('takes a head that arrives a byte at a time, after a 100 Continue, and a body that ends with the connection', async () => {
    const body = bytes(5000, 3);
    const url = await raw(async (s) => {
      const head = 'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n';
      for (const c of head) {
        s.write(c);
        await new Promise((r) => setTimeout(r, 1));
      }
      s.end(body);
    });
    const res = await httpGet(url, { headers: {}, signal: signal() });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/octet-stream');
    expect((await collect(res)).body.equals(body)).toBe(true);
  });

  it('hands over every byte that came before a cut, then fails saying the body ended early', async () => {
    const body = bytes(600, 4);
    const url = await raw((s) => {
      s.write('HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n');
      s.end(body);
    });
    const res = await httpGet(url, { headers: {}, signal: signal() });
    const parts: Buffer[] = [];
    const read = res.readBody(async (b) => {
      parts.push(Buffer.from(b));
    });
    await expect(read).rejects.toMatchObject({
      code: 'EPREMATURE',
      message: 'the connection closed before the body ended',
    });
    expect(Buffer.concat(parts).equals(body)).toBe(true);
  });

  it('hands over what came before an abort, then fails with the abort reason', async () => {
    const controller = new AbortController();
    const url = await raw((s) => {
      s.write('HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n');
      s.write(bytes(300, 5)); // and then nothing
    });
    const res = await httpGet(url, { headers: {}, signal: controller.signal });
    let got = 0;
    const read = res.readBody(
      async (b) => {
        got += b.length;
      },
      () => controller.abort(new Error('stalled')),
    );
    await expect(read).rejects.toThrow('stalled');
    expect(got).toBe(300);
  });

  it('gives a slow body to the sink as it comes, not once a block is full', async () => {
    const url = await raw(async (s) => {
      s.write('HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n');
      for (let i = 0; i < 4; i++) {
        s.write(Buffer.alloc(10, i));
        await new Promise((r) => setTimeout(r, 300));
      }
      s.end();
    });
    const res = await httpGet(url, { headers: {}, signal: signal() });
    const { body, blocks } = await collect(res);
    expect(body).toHaveLength(40);
    expect(blocks.length).toBeGreaterThanOrEqual(3);
  });

  it('stops reading while the sink holds every buffer, then goes on', async () => {
    const body = bytes(48 * 1024 * 1024, 6);
    const port = await listen(
      http.createServer((_, res) => res.writeHead(200, { 'content-length': body.length }).end(body)),
    );
    const res = await httpGet(`http://127.0.0.1:${port}/f`, { headers: {}, signal: signal() });
    let received = 0;
    const held: (() => void)[] = [];
    const parts: Buffer[] = [];
    const read = res.readBody(
      (b) => {
        parts.push(Buffer.from(b));
        return new Promise<void>((r) => held.push(r));
      },
      (n) => {
        received += n;
      },
    );
    await new Promise((r) => setTimeout(r, 300));
    // Four buffers of 4 MiB, and no more, while none comes back.
    expect(received).toBeLessThanOrEqual(16 * 1024 * 1024);
    expect(held.length).toBeGreaterThan(0);
    const releaser = setInterval(() => {
      for (const r of held.splice(0)) r();
    }, 5);
    await read;
    clearInterval(releaser);
    expect(received).toBe(body.length);
    expect(Buffer.concat(parts).equals(body)).toBe(true);
  });

  it('speaks TLS, checking the certificate', async () => {
    const dir = path.join(import.meta.dirname, '../../test/fixtures/tls');
    const cert = fs.readFileSync(path.join(dir, 'localhost.crt'), 'utf8');
    const key = fs.readFileSync(path.join(dir, 'localhost.key'), 'utf8');
    const body = bytes(2 * 1024 * 1024, 8);
    const port = await listen(
      https.createServer({ cert, key }, (_, res) => res.writeHead(200, { 'content-length': body.length }).end(body)),
    );
    const res = await httpGet(`https://localhost:${port}/f`, { headers: {}, signal: signal(), ca: cert });
    expect((await collect(res)).body.equals(body)).toBe(true);
    await expect(httpGet(`https://localhost:${port}/f`, { headers: {}, signal: signal() })).rejects.toThrow(
      /could not reach the upstream \((DEPTH_ZERO_SELF_SIGNED_CERT|SELF_SIGNED_CERT_IN_CHAIN)\)/,
    );
  });

  it.each([
    ['an answer that is not HTTP', 'SSH-2.0-OpenSSH\r\n\r\n', /did not answer in HTTP\/1.1/],
    ['a bad Content-Length', 'HTTP/1.1 200 OK\r\nContent-Length: 12abc\r\n\r\n', /invalid Content-Length \(12abc\)/],
    [
      'two Content-Lengths that disagree',
      'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n',
      /invalid Content-Length \(5, 6\)/,
    ],
    [
      'a transfer coding it cannot read',
      'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n',
      /does not read \(gzip\)/,
    ],
    ['a head over 64 KiB', `HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(70_000)}`, /head is over 65536 bytes/],
    ['a close before any answer', '', /closed the connection without answering/],
  ])('refuses %s', async (_, answer, message) => {
    const url = await raw((s) => s.end(answer));
    await expect(httpGet(url, { headers: {}, signal: signal() })).rejects.toThrow(message);
  });
});
