import type { IncomingMessage } from 'node:http';

// The gateway's limits on what a replica sends back, once it has begun to answer (HANGAR_GATEWAY_FIRST_BYTE_MS
// covers the time before): an engine that hangs mid-answer, or a stream that never ends, must not hold the
// client and the replica's slot for ever; and an error body is read only as far as it needs to be looked into.

/** Why a replica's answer was cut short by the gateway's own limits (told to the client as the reason). */
export class AnswerCut extends Error {
  override name = 'AnswerCut';
}

/**
 * Cuts a replica's answer that goes quiet for `idleMs` or runs past `deadlineMs`, by destroying it with an
 * AnswerCut (which whoever reads it then sees). Time the gateway itself holds the bytes back (a slow client,
 * backpressure) is not the replica's silence and does not count. Returns the function that stops watching.
 */
export function watchAnswer(upstream: IncomingMessage, o: { idleMs: number; deadlineMs: number }): () => void {
  const socket = upstream.socket;
  let lastRead = socket.bytesRead;
  let heardAt = Date.now();
  const idle = setInterval(
    () => {
      const read = socket.bytesRead;
      const heldBack = upstream.isPaused() || upstream.readableLength > 0;
      if (read !== lastRead || heldBack) heardAt = Date.now();
      lastRead = read;
      if (Date.now() - heardAt >= o.idleMs) {
        upstream.destroy(new AnswerCut(`the replica sent nothing for ${o.idleMs} ms (HANGAR_GATEWAY_IDLE_MS)`));
      }
    },
    Math.max(25, Math.floor(o.idleMs / 4)),
  );
  const deadline = setTimeout(() => {
    upstream.destroy(
      new AnswerCut(
        `the answer went on past ${Math.round(o.deadlineMs / 1000)} s, the most the gateway allows (HANGAR_GATEWAY_DEADLINE_SECONDS)`,
      ),
    );
  }, o.deadlineMs);
  idle.unref();
  deadline.unref();
  return () => {
    clearInterval(idle);
    clearTimeout(deadline);
  };
}

/** Up to `max` bytes of an answer (an error's body, read whole to look into it); the rest is not read. */
export async function readCapped(upstream: IncomingMessage, max: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of upstream) {
    chunks.push(chunk as Buffer);
    size += (chunk as Buffer).length;
    if (size >= max) break;
  }
  return Buffer.concat(chunks).subarray(0, max);
}
