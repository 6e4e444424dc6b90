import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DbRelay, relayedDatabase } from '../test/fixtures/db-relay.js';
import { freshDatabase } from '../test/harness.js';
import type { Database } from './db/database.js';
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

describe('makePubSub', () => {
  it('hands an event to 1000 subscribers with one read between them, and warns of no leak', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    const pubsub = makePubSub();
    const its = Array.from({ length: 1000 }, () => pubsub.subscribe('mirrorVersion')[Symbol.asyncIterator]());
    const first = its.map((it) => it.next());
    // A Repeater starts listening at its first next(); let them all get there.
    await new Promise((r) => setImmediate(r));
    let reads = 0;
    const read = async () => ({ read: ++reads });
    pubsub.publish('mirrorVersion', 'm/v1');
    const heard = await Promise.all(first.map((p) => p.then((r) => r.value)));
    expect(heard.every((id) => id === 'm/v1')).toBe(true);
    const got = await Promise.all(heard.map((id) => pubsub.shared('mirrorVersion', id as string, 'version', read)));
    expect(reads).toBe(1);
    expect(new Set(got).size).toBe(1);

    // The next event reads again: what was read for the last one may be out of date.
    const second = its.map((it) => it.next());
    pubsub.publish('mirrorVersion', 'm/v1');
    await Promise.all(second);
    expect(await pubsub.shared('mirrorVersion', 'm/v1', 'version', read)).toEqual({ read: 2 });
    await Promise.all(its.map((it) => it.return?.()));
    await new Promise((r) => setImmediate(r));
    process.off('warning', onWarning);
    expect(warnings).toEqual([]);
  });
});
