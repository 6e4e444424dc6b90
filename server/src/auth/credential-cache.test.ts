import { createLogger } from '@hangar/common/log';
import { afterEach, describe, expect, it } from 'vitest';
import { makePubSub } from '../pubsub.js';
import { CredentialCache } from './credential-cache.js';

// The rules of the cache on their own, without a database: what is kept, and when it is not.

type Found = { ok: boolean; userId: string; n: number; expiresAt: Date | null };

function setup(options: { listeningSince?: () => number | undefined } = {}) {
  const pubsub = makePubSub();
  const cache = new CredentialCache<Found>((f) => (f.ok ? { userId: f.userId, expiresAt: f.expiresAt } : undefined));
  let loads = 0;
  const load =
    (over: Partial<Found> = {}, delay?: Promise<void>) =>
    async (): Promise<Found> => {
      loads++;
      await delay;
      return { ok: true, userId: 'u1', n: loads, expiresAt: null, ...over };
    };
  cache.start({ pubsub, listeningSince: options.listeningSince ?? (() => 0), log: createLogger('silent') });
  caches.push(cache);
  return { pubsub, cache, load, loads: () => loads };
}

const caches: CredentialCache<Found>[] = [];
afterEach(() => {
  for (const c of caches.splice(0)) c.stop();
});

const tick = () => new Promise<void>((r) => setTimeout(r, 5));

describe('CredentialCache', () => {
  it('keeps an answer, and drops it at once on its user’s credentials event', async () => {
    const { pubsub, cache, load, loads } = setup();
    await cache.get('k', load());
    await cache.get('k', load());
    expect(loads()).toBe(1);
    pubsub.publish('credentials', 'user:other');
    await tick();
    await cache.get('k', load());
    expect(loads()).toBe(1);
    pubsub.publish('credentials', 'user:u1');
    await tick();
    await cache.get('k', load());
    expect(loads()).toBe(2);
  });

  it('keeps nothing while the process hears no events, nor what it kept before the break', async () => {
    let since: number | undefined;
    const { cache, load, loads } = setup({ listeningSince: () => since });
    await cache.get('k', load());
    await cache.get('k', load());
    expect(loads()).toBe(2);
    since = Date.now();
    await cache.get('k', load());
    await cache.get('k', load());
    expect(loads()).toBe(3);
    // Back after a break: an event may have been missed meanwhile.
    since = Date.now() + 1;
    await cache.get('k', load());
    expect(loads()).toBe(4);
  });

  it('answers from what it kept while the database cannot be reached, but never for a user whose event it heard', async () => {
    let since: number | undefined = 0;
    const { pubsub, cache, load } = setup({ listeningSince: () => since });
    // As node-postgres says it when PostgreSQL is gone.
    const down = async (): Promise<Found> => {
      throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' });
    };
    const kept = await cache.get('k', load());
    await cache.get('other', load({ userId: 'u2' }));
    pubsub.publish('credentials', 'user:u2');
    await tick();
    // The outage: the events' connection is gone too, and every lookup fails for want of the database.
    since = undefined;
    expect(await cache.get('k', down)).toEqual(kept);
    await expect(cache.get('other', down)).rejects.toThrow(/ECONNREFUSED/);
    await expect(cache.get('never-seen', down)).rejects.toThrow(/ECONNREFUSED/);
    // Any other failure is not an outage: it is not papered over.
    await expect(cache.get('k', () => Promise.reject(new Error('a bug')))).rejects.toThrow(/a bug/);
  });

  it('never answers an outage with an acceptance the database has since refused (its event unheard)', async () => {
    let since: number | undefined = 0;
    const { cache, load } = setup({ listeningSince: () => since });
    const down = async (): Promise<Found> => {
      throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' });
    };
    await cache.get('revoked-heard-late', load());
    await cache.get('revoked-unheard', load());
    // Revoked while the events were heard but its event missed: the fresh lookup refuses it.
    expect(await cache.get('revoked-heard-late', load({ ok: false }), true)).toMatchObject({ ok: false });
    // Revoked while no events were heard: looked up every time, and refused.
    since = undefined;
    expect(await cache.get('revoked-unheard', load({ ok: false }))).toMatchObject({ ok: false });
    // Then the database goes: neither old acceptance comes back.
    await expect(cache.get('revoked-heard-late', down)).rejects.toThrow(/ECONNREFUSED/);
    await expect(cache.get('revoked-unheard', down)).rejects.toThrow(/ECONNREFUSED/);
  });

  it('does not keep a lookup that straddled a change, nor a refusal', async () => {
    const { pubsub, cache, load, loads } = setup();
    let release!: () => void;
    const slow = new Promise<void>((r) => {
      release = r;
    });
    const pending = cache.get('k', load({}, slow));
    await tick();
    pubsub.publish('credentials', 'user:u1');
    await tick();
    release();
    await pending;
    await cache.get('k', load());
    expect(loads()).toBe(2);
    await cache.get('r', load({ ok: false }));
    await cache.get('r', load({ ok: false }));
    expect(loads()).toBe(4);
  });

  it('makes one lookup for a burst of callers', async () => {
    const { cache, load, loads } = setup();
    const answers = await Promise.all(Array.from({ length: 20 }, () => cache.get('k', load({}, tick()))));
    expect(loads()).toBe(1);
    expect(new Set(answers.map((a) => a.n))).toEqual(new Set([1]));
  });

  it('does not serve an answer past the credential’s expiry', async () => {
    const { cache, load, loads } = setup();
    const expiresAt = new Date(Date.now() + 30);
    await cache.get('k', load({ expiresAt }));
    await cache.get('k', load({ expiresAt }));
    expect(loads()).toBe(1);
    await new Promise((r) => setTimeout(r, 40));
    await cache.get('k', load({ expiresAt }));
    expect(loads()).toBe(2);
  });

  it('looks up past what is kept when asked for a fresh answer', async () => {
    const { cache, load, loads } = setup();
    await cache.get('k', load());
    expect((await cache.get('k', load(), true)).n).toBe(2);
    expect((await cache.get('k', load())).n).toBe(2);
    expect(loads()).toBe(2);
  });
});
