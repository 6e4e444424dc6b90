import net from 'node:net';
import tls from 'node:tls';
import type { OutboundGuard } from '../outbound.js';
import { ChunkedDecoder } from './chunked.js';
import { proxyAuthorization, proxyFor, refusedByResolution, tunnel } from './proxy.js';

// A GET for the mirror's downloads on a socket of its own, rather than node:http or fetch(). Both of those hand a
// body over as 64 KiB chunks through one or two stream layers, and at a fast upstream that alone held a fetch to
// 0.46× `curl -o` (bench/mirror.ts). Here the socket reads straight into a few large buffers (Node's `onread`),
// the body's framing is undone in place, and the consumer gets blocks of up to 4 MiB that it hashes and writes
// while the next ones arrive: no copy in JavaScript and no garbage per chunk.
//
// It speaks the part of HTTP/1.1 (RFC 9112) a file download needs: one request per connection, bodies framed by
// Content-Length, chunked or the connection's close, 1xx heads skipped, redirects followed (the Hub sends every
// file to its CDN) with the credentials dropped when a redirect leaves the origin, and TLS checked against
// Node's CAs (NODE_EXTRA_CA_CERTS adds a private one). With a guard (the server's own fetches), every hop is
// checked before it is sent and connects only to the addresses the guard allows, so a redirect cannot lead a
// download into the server's own network.
//
// Through a proxy (HTTPS_PROXY / HTTP_PROXY / NO_PROXY, proxy.ts): an https:// URL goes through a CONNECT tunnel
// with TLS to the upstream inside it, so the proxy never sees the request's headers; an http:// URL is sent to
// the proxy in absolute form, as HTTP proxies expect (its headers are in the clear there, as they are on the wire).
//
// Over 400 lines: one exchange's reads, framing and buffers share its fields, and read best in one place.

export type GetResponse = {
  status: number;
  headers: Headers;
  /**
   * Hands the body to `sink` block by block, in order, each as soon as it is ready: the sink is called again
   * before the previous block's promise settles, while the next blocks are received into other buffers. A block's
   * memory is reused once its promise settles: copy what must outlive it. After a sink's promise rejects, no
   * further block is handed over, and readBody rejects with that error. `onBytes`
   * hears of every read as it lands (a stall timer). Resolves once the whole body has been through the sink;
   * rejects when the connection fails or ends early, but only after the sink has had every byte that did arrive,
   * so a resume can start where they stop.
   */
  readBody(sink: (block: Buffer) => Promise<void>, onBytes?: (n: number) => void): Promise<void>;
  /** Drops the body and its connection. */
  cancel(): void;
};

export class HttpGetError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

/** A block at most; reads go on into the next buffer once fewer than MIN_READ bytes are left in this one. */
const BLOCK = 4 << 20;
const MIN_READ = 64 << 10;
/** Buffers per response: one being filled, the rest with the sink or waiting for it. Then the socket waits. */
const POOL = 4;
const HEAD_LIMIT = 64 << 10;
/** A block that fills slowly goes to an idle sink unfilled this often, so a slow link's progress moves. */
const PARTIAL_MS = 200;
const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 10;
/** Headers that carry credentials: never sent to another origin a redirect points at. */
const PRIVATE = ['authorization', 'cookie', 'proxy-authorization'];

export async function httpGet(
  url: string,
  o: {
    headers: Record<string, string>;
    signal: AbortSignal;
    ca?: string;
    guard?: OutboundGuard;
    /** The proxy for a URL, or null for none; the environment's (proxyFor) unless given. */
    proxy?: (url: URL) => URL | null;
  },
): Promise<GetResponse> {
  let current = new URL(url);
  let headers = { ...o.headers };
  for (let hop = 0; hop <= MAX_REDIRECTS; hop++) {
    const refused = o.guard?.refuse(current);
    if (refused) throw new HttpGetError(hop ? `a redirect led to ${refused}` : refused, 'EOUTBOUND');
    const proxy = (o.proxy ?? proxyFor)(current);
    // Through a proxy the connection's addresses are the proxy's: the host is checked by what it resolves to here.
    const resolved = proxy && o.guard ? await refusedByResolution(current, o.guard) : null;
    if (resolved) throw new HttpGetError(hop ? `a redirect led to ${resolved}` : resolved, 'EOUTBOUND');
    const lookup = proxy ? undefined : o.guard?.lookup(current);
    const res = await new Exchange(current, headers, o.signal, o.ca, lookup, proxy).response.catch(
      (err: HttpGetError) => {
        throw hop && err.code === 'EOUTBOUND' ? new HttpGetError(`a redirect led to ${err.message}`, err.code) : err;
      },
    );
    const location = res.headers.get('location');
    if (!REDIRECTS.has(res.status) || !location) return res;
    res.cancel();
    const next = new URL(location, current);
    if (next.protocol !== 'http:' && next.protocol !== 'https:')
      throw new HttpGetError(`the upstream redirected to a ${next.protocol} URL`);
    if (next.origin !== current.origin)
      headers = Object.fromEntries(Object.entries(headers).filter(([k]) => !PRIVATE.includes(k.toLowerCase())));
    current = next;
  }
  throw new HttpGetError(`the upstream redirected more than ${MAX_REDIRECTS} times`);
}

type Framing =
  | { kind: 'length'; left: number }
  | { kind: 'chunked'; decoder: ChunkedDecoder }
  /** Until the server closes the connection (HTTP/1.0 style). */
  | { kind: 'close' };

/** One request and its response on a connection of its own. */
class Exchange {
  readonly response: Promise<GetResponse>;
  /** Unset only while a proxy's tunnel is being opened. */
  private socket: net.Socket | undefined;
  private free: Buffer[] = [];
  private made = 0;
  /** The buffer reads land in, and how much of it holds the head (until parsed) or then body bytes. */
  private cur: Buffer;
  private filled = 0;
  private handedAt = 0;
  private ready: { buf: Buffer; len: number }[] = [];
  private framing: Framing | null = null;
  private received = 0;
  private ended = false;
  private failure: Error | null = null;
  /** Blocks handed to the sink whose promises have not settled. */
  private inSink = 0;
  private paused = false;
  private wake: (() => void) | null = null;
  private onBytes: ((n: number) => void) | undefined;
  private answer!: { resolve: (r: GetResponse) => void; reject: (e: Error) => void };

  constructor(
    url: URL,
    headers: Record<string, string>,
    private signal: AbortSignal,
    ca: string | undefined,
    lookup: net.LookupFunction | undefined,
    proxy: URL | null = null,
  ) {
    this.response = new Promise((resolve, reject) => {
      this.answer = { resolve, reject };
    });
    // A plain-HTTP proxy takes the whole URL on the request line, and its own credentials in a header.
    const viaProxy = proxy !== null && url.protocol === 'http:';
    const all = { host: url.host, ...headers, ...(viaProxy ? proxyAuthorization(proxy) : {}), connection: 'close' };
    const lines = Object.entries(all).map(([k, v]) => {
      if (/[\r\n]/.test(k) || /[\r\n]/.test(v)) throw new HttpGetError(`the header ${k} holds a line break`);
      return `${k}: ${v}\r\n`;
    });
    const target = viaProxy ? `${url.origin}${url.pathname}${url.search}` : `${url.pathname}${url.search}`;
    const request = `GET ${target} HTTP/1.1\r\n${lines.join('')}\r\n`;
    this.cur = this.take() as Buffer;
    const host = url.hostname.replace(/^\[|\]$/g, '');
    const onread = { buffer: () => this.cur.subarray(this.filled), callback: (n: number) => this.onRead(n) };
    if (signal.aborted) this.fail(signal.reason);
    else signal.addEventListener('abort', this.onAbort, { once: true });
    if (proxy && url.protocol === 'https:') {
      tunnel(proxy, url, signal).then(
        (raw) => {
          if (this.failure) return void raw.destroy();
          // Over an existing socket TLS ignores `onread`: its reads arrive as 'data' and are copied in (feed).
          const socket = tls.connect({ socket: raw, servername: net.isIP(host) ? undefined : host, ca });
          socket.on('data', (chunk: Buffer) => this.feed(chunk));
          this.attach(socket, request);
        },
        (err: NodeJS.ErrnoException) =>
          this.fail(
            new HttpGetError(
              err.code === 'EPROXY'
                ? err.message
                : `could not reach the proxy ${proxy.host} (${err.code ?? err.message})`,
              err.code,
            ),
          ),
      );
      return;
    }
    const to = viaProxy ? proxy : url;
    const toHost = to.hostname.replace(/^\[|\]$/g, '');
    const port = Number(to.port) || (to.protocol === 'https:' ? 443 : 80);
    this.attach(
      to.protocol === 'https:'
        ? // tls.connect takes every net.connect option, `onread` too, though @types/node leaves it out.
          tls.connect({
            host: toHost,
            port,
            servername: net.isIP(toHost) ? undefined : toHost,
            ca: viaProxy ? undefined : ca,
            onread,
            lookup,
          } as tls.ConnectionOptions)
        : net.connect({ host: toHost, port, onread, lookup }),
      request,
    );
  }

  private attach(socket: net.Socket, request: string) {
    this.socket = socket;
    socket.on('error', (err: NodeJS.ErrnoException) => {
      this.fail(
        err.code === 'EOUTBOUND'
          ? new HttpGetError(err.message, err.code)
          : this.framing
            ? new HttpGetError(`the connection failed (${err.code ?? err.message})`, err.code)
            : new HttpGetError(`could not reach the upstream (${err.code ?? err.message})`, err.code),
      );
    });
    socket.on('end', () => this.onEnd());
    socket.on('close', () => this.onEnd());
    if (this.failure) socket.destroy();
    else socket.write(request, 'latin1');
  }

  /** Bytes that arrived as a 'data' event (TLS inside a tunnel), copied into the buffers `onread` would fill. */
  private feed(chunk: Buffer) {
    for (let from = 0; from < chunk.length && !this.ended && !this.failure; ) {
      const n = Math.min(this.cur.length - this.filled, chunk.length - from);
      chunk.copy(this.cur, this.filled, from, from + n);
      from += n;
      // False: the body is done, failed, or the sink holds every buffer (then the rest of this chunk goes into
      // the spare one handOver made, and the socket waits).
      if (!this.onRead(n) && !this.ended && !this.failure) this.socket?.pause();
    }
  }

  private onAbort = () => this.fail(this.signal.reason);

  /** A fresh buffer from the pool, or none when every one is taken. */
  private take(): Buffer | undefined {
    if (this.free.length) return this.free.pop();
    if (this.made === POOL) return undefined;
    this.made++;
    return Buffer.from(new SharedArrayBuffer(BLOCK)); // untouched pages cost nothing until a read lands in them
  }

  /** `n` bytes have landed at cur[filled…]. Returning false pauses the socket until the sink frees a buffer. */
  private onRead(n: number): boolean {
    if (this.ended || this.failure) return false;
    if (!this.framing) return this.onHeadBytes(n);
    return this.onBodyBytes(this.filled, n);
  }

  private onHeadBytes(n: number): boolean {
    const from = Math.max(0, this.filled - 3);
    this.filled += n;
    const end = this.cur.subarray(0, this.filled).indexOf('\r\n\r\n', from, 'latin1');
    if (end < 0) {
      if (this.filled > HEAD_LIMIT)
        this.fail(new HttpGetError(`the upstream's response head is over ${HEAD_LIMIT} bytes`));
      return true;
    }
    const rest = this.filled - (end + 4);
    let head: { status: number; headers: Headers };
    try {
      head = parseHead(this.cur.toString('latin1', 0, end));
    } catch (err) {
      this.fail(err as Error);
      return false;
    }
    this.cur.copyWithin(0, end + 4, this.filled);
    this.filled = 0;
    if (head.status >= 100 && head.status < 200) return rest > 0 ? this.onHeadBytes(rest) : true; // 100 Continue …
    try {
      this.framing = framingOf(head.status, head.headers);
    } catch (err) {
      this.fail(err as Error);
      return false;
    }
    this.answer.resolve({
      ...head,
      readBody: (sink, onBytes) => this.readBody(sink, onBytes),
      cancel: () => this.fail(new HttpGetError('cancelled')),
    });
    if (this.framing.kind === 'length' && this.framing.left === 0) {
      this.finish();
      return false;
    }
    return rest > 0 ? this.onBodyBytes(0, rest) : true;
  }

  /** Undoes the framing of `n` raw bytes at cur[at…], in place. */
  private onBodyBytes(at: number, n: number): boolean {
    const f = this.framing as Framing;
    let payload = n;
    let done = false;
    if (f.kind === 'length') {
      payload = Math.min(n, f.left);
      f.left -= payload;
      done = f.left === 0;
    } else if (f.kind === 'chunked') {
      try {
        const r = f.decoder.decode(this.cur, at, at + n);
        payload = r.end - at;
        done = r.done;
      } catch (err) {
        this.fail(err as Error);
        return false;
      }
    }
    this.filled += payload;
    this.received += payload;
    if (payload > 0) this.onBytes?.(payload);
    if (done) {
      this.finish();
      return false;
    }
    const full = this.cur.length - this.filled < MIN_READ;
    const idle = this.filled > 0 && this.inSink === 0 && performance.now() - this.handedAt >= PARTIAL_MS;
    if (full || idle) return this.handOver();
    return true;
  }

  /** The filled part of the current buffer goes to the sink; reads go on in the next buffer, if there is one. */
  private handOver(): boolean {
    if (this.filled > 0) this.ready.push({ buf: this.cur, len: this.filled });
    this.handedAt = performance.now();
    this.filled = 0;
    this.wakeSink();
    // The socket is paused before the pool runs dry, so this falls back only if a read was already on its way
    // (TLS can hold decrypted bytes): a buffer more, rather than a read into a block the sink holds.
    this.cur = this.take() ?? Buffer.from(new SharedArrayBuffer(BLOCK));
    // With no spare buffer left, the one just taken is filled and the socket waits for the sink.
    this.paused = this.free.length === 0 && this.made >= POOL;
    return !this.paused;
  }

  private release(buf: Buffer) {
    this.free.push(buf);
    if (this.paused && !this.ended && !this.failure) {
      this.paused = false;
      this.socket?.resume(); // with `onread`, a false from the callback stopped reading without marking it paused
    }
  }

  private onEnd() {
    if (this.ended || this.failure) return;
    if (this.framing?.kind === 'close') this.finish();
    else if (!this.framing) this.fail(new HttpGetError('the upstream closed the connection without answering'));
    else this.fail(new HttpGetError('the connection closed before the body ended', 'EPREMATURE'));
  }

  private finish() {
    this.ended = true;
    this.close();
  }

  private fail(err: Error) {
    if (this.ended || this.failure) return;
    this.failure = err;
    this.answer.reject(err);
    this.close();
  }

  /** What arrived goes to the sink even when the end is a failure: it is on the wire and good. */
  private close() {
    this.signal.removeEventListener('abort', this.onAbort);
    if (this.framing && this.filled > 0) this.handOver();
    this.socket?.destroy();
    this.wakeSink();
  }

  private wakeSink() {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  private async readBody(sink: (block: Buffer) => Promise<void>, onBytes?: (n: number) => void) {
    this.onBytes = onBytes;
    if (this.received > 0) onBytes?.(this.received);
    let sinkError: Error | null = null;
    for (;;) {
      const block = this.ready.shift();
      if (block && !sinkError) {
        // Called at once, not after the previous block's promise: the sink's synchronous part (a hash) runs in
        // order while earlier blocks are still being written.
        this.inSink++;
        let taken: Promise<void>;
        try {
          taken = sink(block.buf.subarray(0, block.len));
        } catch (err) {
          taken = Promise.reject(err);
        }
        taken.then(
          () => {
            this.inSink--;
            this.release(block.buf);
            this.wakeSink();
          },
          (err: Error) => {
            this.inSink--;
            sinkError ??= err;
            this.fail(err);
            this.wakeSink();
          },
        );
        continue;
      }
      if (this.inSink === 0) {
        if (sinkError) throw sinkError;
        if (this.failure) throw this.failure;
        if (this.ended) return;
      }
      await new Promise<void>((r) => {
        this.wake = r;
      });
    }
  }
}

function parseHead(text: string): { status: number; headers: Headers } {
  const [statusLine = '', ...fields] = text.split('\r\n');
  const m = statusLine.match(/^HTTP\/1\.[01] (\d{3})(?: .*)?$/);
  if (!m)
    throw new HttpGetError(`the upstream did not answer in HTTP/1.1 (${JSON.stringify(statusLine.slice(0, 60))})`);
  const headers = new Headers();
  for (const line of fields) {
    const colon = line.indexOf(':');
    if (colon <= 0 || /^[ \t]/.test(line)) throw new HttpGetError(`the upstream sent a malformed header line`);
    headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
  }
  return { status: Number(m[1]), headers };
}

function framingOf(status: number, headers: Headers): Framing {
  if (status === 204 || status === 304) return { kind: 'length', left: 0 };
  const te = headers.get('transfer-encoding');
  if (te) {
    if (te.toLowerCase().split(',').at(-1)?.trim() !== 'chunked')
      throw new HttpGetError(`the upstream used a transfer coding this client does not read (${te})`);
    return { kind: 'chunked', decoder: new ChunkedDecoder() };
  }
  const length = headers.get('content-length');
  if (length === null) return { kind: 'close' };
  // Repeated Content-Length fields arrive joined by ", "; they must all agree.
  const values = new Set(length.split(',').map((v) => v.trim()));
  const n = Number([...values][0]);
  if (values.size !== 1 || !/^\d+$/.test([...values][0] ?? '') || !Number.isSafeInteger(n))
    throw new HttpGetError(`the upstream sent an invalid Content-Length (${length})`);
  return { kind: 'length', left: n };
}
