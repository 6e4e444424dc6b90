import type { IncomingMessage, ServerResponse } from 'node:http';

// A replica's streamed answer passed on to the client through a tap (proxy.ts: SseTap, JsonTap), chunk by chunk with
// backpressure, by the streams' own events: not pipeline(), whose machinery (a promise, end-of-stream watchers and
// a Transform's callbacks per chunk) showed in the gateway's profile at every token of every stream.

/** What a tap does with each chunk, and with what is left at the end (proxy.ts's taps). */
export type Tap = { passOn(chunk: Buffer): Buffer | string; rest(): Buffer | null };

/**
 * Resolves once the replica's answer ended and all of it was handed to `res` (which is then ended). Rejects when
 * the answer fails or is cut off before its end, leaving `res` as it is: the caller says why, or destroys it.
 */
export function relay(upstream: IncomingMessage, res: ServerResponse, tap: Tap): Promise<void> {
  return new Promise((resolve, reject) => {
    let settled = false;
    const resume = () => upstream.resume();
    const done = (err?: Error) => {
      if (settled) return;
      settled = true;
      upstream.off('data', onData);
      res.off('drain', resume);
      if (err) reject(err);
      else resolve();
    };
    const onData = (chunk: Buffer) => {
      const out = tap.passOn(chunk);
      // The client reads slower than the replica sends: the replica waits (its socket's window fills).
      if (out.length && !res.write(out)) {
        upstream.pause();
        res.once('drain', resume);
      }
    };
    upstream.on('data', onData);
    upstream.once('end', () => {
      const rest = tap.rest();
      if (rest) res.end(rest);
      else res.end();
      done();
    });
    upstream.once('error', (err) => done(err));
    upstream.once('close', () => {
      if (!upstream.readableEnded) done(new Error('the replica closed the connection mid-answer'));
    });
  });
}
