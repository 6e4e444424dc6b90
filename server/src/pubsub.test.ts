import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DbRelay, relayedDatabase } from '../test/fixtures/db-relay.js';
import { freshDatabase } from '../test/harness.js';
import type { Database } from './db/database.js';
import { createLogger } from './lib/log.js';
import { listen, makePubSub, notify } from './pubsub.js';

// Live events ride one LISTEN connection per process. Losing it, or not having it at the first try, must not
// throw (that used to stop the server from starting, or left the event stream silent for good): the listener
// reconnects once the database answers, and events flow again.

let relay: DbRelay;
let direct: Database;
beforeAll(async () => {
  relay = await relayedDatabase();
  direct = await freshDatabase();
});
afterAll(async () => {
  await relay?.database.close();
  await direct?.close();
});

/** The next `mirrorVersion` event this process hears, or undefined after `ms`. */
async function nextEvent(pubsub: ReturnType<typeof makePubSub>, ms: number): Promise<string | undefined> {
  const it = pubsub.subscribe('mirrorVersion')[Symbol.asyncIterator]();
  const timeout = new Promise<undefined>((r) => setTimeout(() => r(undefined), ms));
  const next = it.next().then((r) => r.value as string);
  const got = await Promise.race([next, timeout]);
  await it.return?.();
  return got;
}

describe('listen', () => {
  it('starts without the database, and listens once it answers; a cut connection is reconnected', async () => {
    const lines: string[] = [];
    const log = createLogger('info', (l) => lines.push(JSON.parse(l).msg));
    const pubsub = makePubSub();
    await relay.cut();
    const listener = await listen(relay.database.url, pubsub, log);
    expect(listener.listening()).toBe(false);
    await relay.mend();
    const end = Date.now() + 10_000;
    while (!listener.listening() && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
    expect(listener.listening()).toBe(true);
    const heard = nextEvent(pubsub, 5000);
    await notify(relay.database.prisma, 'mirrorVersion', 'a/v1');
    expect(await heard).toBe('a/v1');

    await relay.cut();
    while (listener.listening() && Date.now() < end + 10_000) await new Promise((r) => setTimeout(r, 50));
    expect(listener.listening()).toBe(false);
    await relay.mend();
    while (!listener.listening() && Date.now() < end + 20_000) await new Promise((r) => setTimeout(r, 50));
    const again = nextEvent(pubsub, 5000);
    await notify(relay.database.prisma, 'mirrorVersion', 'b/v1');
    expect(await again).toBe('b/v1');
    await listener.stop();
    // Lost twice, back twice: said once each time, not once per reconnect attempt.
    expect(lines.filter((l) => l.startsWith('live events: no connection'))).toHaveLength(2);
    expect(lines.filter((l) => l === 'live events: listening again')).toHaveLength(2);
  }, 40_000);

  it('stops cleanly while it is still trying to reconnect', async () => {
    const listener = await listen(direct.url.replace(/:\d+\//, ':1/'), makePubSub(), createLogger('silent'));
    expect(listener.listening()).toBe(false);
    await listener.stop();
  });
});
