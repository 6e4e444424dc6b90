import { channel } from 'node:diagnostics_channel';
import fs from 'node:fs/promises';
import pg from 'pg';

// Where one fetch's time goes outside the download loop (#33): every query this process sends to PostgreSQL
// (Prisma's adapter and the LISTEN connection both go through pg's Client), with when it was sent and how long it
// took, beside when the upstream's connection opened and when the first and last byte went into a file. Hangar
// runs in the bench's process, so these are Hangar's. Only for bench/mirror.ts's `trace` part: it wraps pg and
// FileHandle for the rest of the process, which costs every query a closure and every write a clock read.

export type TraceEvent = { at: number; ms: number; what: string };

type Query = (this: pg.Client, ...args: unknown[]) => unknown;

export async function startTrace() {
  const events: TraceEvent[] = [];
  let writes = { first: Number.NaN, last: Number.NaN, count: 0 };
  const proto = pg.Client.prototype as unknown as { query: Query };
  const query = proto.query;
  proto.query = function (this: pg.Client, ...args: unknown[]) {
    const first = args[0] as string | { text?: string };
    const text = (typeof first === 'string' ? first : (first?.text ?? '?')).replace(/\s+/g, ' ').trim();
    const at = performance.now();
    const out = query.apply(this, args);
    const done = () => events.push({ at, ms: performance.now() - at, what: text });
    if (out && typeof (out as Promise<unknown>).then === 'function') (out as Promise<unknown>).then(done, done);
    else done();
    return out;
  };
  // The upstream's connection: net emits on this channel for every client socket it makes.
  const sockets = channel('net.client.socket');
  const onSocket = (m: unknown) => {
    const socket = (m as { socket: import('node:net').Socket }).socket;
    const at = performance.now();
    socket.once('connect', () =>
      events.push({ at, ms: performance.now() - at, what: `[socket to ${socket.remotePort}] connected` }),
    );
  };
  sockets.subscribe(onSocket);
  // Bytes into a file: FileHandle's write, found on the prototype of any handle.
  const probe = await fs.open('/dev/null', 'r');
  const fhProto = Object.getPrototypeOf(probe) as { write: (...a: unknown[]) => Promise<unknown> };
  await probe.close();
  const write = fhProto.write;
  fhProto.write = function (this: unknown, ...a: unknown[]) {
    const now = performance.now();
    if (writes.count++ === 0) writes.first = now;
    writes.last = now;
    return write.apply(this, a);
  };
  return {
    events,
    /** Starts counting anew (after the warm-up). */
    reset() {
      events.length = 0;
      writes = { first: Number.NaN, last: Number.NaN, count: 0 };
    },
    writes: () => writes,
    stop() {
      proto.query = query;
      fhProto.write = write;
      sockets.unsubscribe(onSocket);
    },
  };
}

/** The timeline from the mutation (t0): each query, with its start and duration in ms. */
export function printTrace(
  t0: number,
  events: TraceEvent[],
  writes: { first: number; last: number; count: number },
  seen: Record<string, number>,
  end: number,
) {
  const rows = [
    ...events.map((e) => ({ at: e.at - t0, text: `${e.ms.toFixed(1).padStart(6)} ms  ${e.what.slice(0, 110)}` })),
    { at: writes.first - t0, text: `             first block written into a file (${writes.count} writes in all)` },
    { at: writes.last - t0, text: '             last block written' },
    ...Object.entries(seen).map(([state, at]) => ({ at, text: `             ${state} heard by the subscription` })),
  ].sort((a, b) => a.at - b.at);
  const queries = events.filter((e) => !e.what.startsWith('[')).filter((e) => e.at - t0 <= end);
  console.log(
    `  traced fetch: ${queries.length} queries from the mutation to PRESENT heard (${end.toFixed(0)} ms); the timeline:`,
  );
  for (const r of rows) if (r.at <= end + 1) console.log(`  ${r.at.toFixed(1).padStart(9)} ms ${r.text}`);
  // The part of the time that does not grow with the file: before its first byte, and after its last.
  const before = writes.first - t0;
  const after = end - (writes.last - t0);
  console.log(
    `  fixed cost: mutation → first block written ${before.toFixed(0)} ms, last block written → PRESENT heard ${after.toFixed(0)} ms`,
  );
}
