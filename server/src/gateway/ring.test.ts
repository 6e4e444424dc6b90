import { describe, expect, it } from 'vitest';
import { affinityKey } from './affinity.js';
import { HashRing, hashText, loadBound } from './ring.js';

// The hash ring the gateway routes keyed requests by (ring.ts): which replica a key names, how much moves when a
// replica joins or leaves, that every server process builds the same ring, and that a loaded replica sheds.

const ids = (n: number) => Array.from({ length: n }, (_, i) => `0b5a7c1e-0000-4000-8000-00000000000${i}`);
const keys = Array.from({ length: 10_000 }, (_, i) => hashText(`conversation ${i}`));
const idle = () => 0;
const owner = (ring: HashRing, key: number, eligible: (id: string) => boolean = () => true) =>
  ring.ids[ring.pick(key, 1, (i) => eligible(ring.ids[i]!), idle)];

describe('the hash ring', () => {
  it('is the same ring in every server process: it depends on the replica ids, not on the order they were read', () => {
    const a = new HashRing(ids(4));
    const b = new HashRing([...ids(4)].reverse());
    for (const k of keys.slice(0, 2000)) expect(owner(b, k)).toBe(owner(a, k));
  });

  it('splits keys about evenly', () => {
    const ring = new HashRing(ids(4));
    const count = new Map<string, number>();
    for (const k of keys) count.set(owner(ring, k)!, (count.get(owner(ring, k)!) ?? 0) + 1);
    for (const n of count.values()) expect(n).toBeGreaterThan(10_000 / 4 / 1.5);
  });

  it('moves only the keys of a replica that leaves, and only keys to a replica that joins', () => {
    const five = new HashRing(ids(5));
    const four = new HashRing(ids(5).slice(0, 4));
    const leaving = ids(5)[4]!;
    let moved = 0;
    for (const k of keys) {
      const before = owner(five, k);
      const after = owner(four, k);
      if (before !== leaving) expect(after).toBe(before);
      else moved++;
    }
    // What moved is the leaving replica's share, about a fifth, and nothing else.
    expect(moved).toBeGreaterThan(10_000 / 5 / 1.5);
    expect(moved).toBeLessThan((10_000 / 5) * 1.5);
    // Joining is the same seen the other way: a key moves only to the new replica.
    for (const k of keys) {
      const before = owner(four, k);
      const after = owner(five, k);
      if (after !== leaving) expect(after).toBe(before);
    }
  });

  it('skips a replica that cannot take the request (failing, not ready) for the next on the ring, moving only its keys', () => {
    const ring = new HashRing(ids(3));
    const down = ids(3)[1]!;
    for (const k of keys.slice(0, 3000)) {
      const usual = owner(ring, k);
      const now = owner(ring, k, (id) => id !== down);
      if (usual !== down) expect(now).toBe(usual);
      else expect(now).not.toBe(down);
    }
  });

  it('sheds from a replica loaded past the bound to the next on the ring', () => {
    const ring = new HashRing(ids(2));
    const key = keys[0]!;
    const home = ring.pick(key, 1, () => true, idle);
    const load = [0, 0];
    const factor = 1.25;
    const picks: number[] = [];
    // Requests of one conversation arriving while the earlier ones are still in flight.
    for (let n = 0; n < 4; n++) {
      const bound = loadBound(load[0]! + load[1]!, 2, factor);
      const i = ring.pick(
        key,
        bound,
        () => true,
        (r) => load[r]!,
      );
      picks.push(i);
      load[i]!++;
    }
    // The key's own replica takes two (the mean times 1.25, rounded up), the third goes to the other, the fourth
    // back home once the mean has risen.
    expect(picks).toEqual([home, home, 1 - home, home]);
  });
});

describe('the affinity key', () => {
  const body = (first: string, ...more: string[]) => ({
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: first },
      ...more.flatMap((m) => [
        { role: 'assistant', content: 'ok' },
        { role: 'user', content: m },
      ]),
    ],
  });
  const key = (
    b: Record<string, unknown>,
    o: { scope?: string; policy?: 'PREFIX' | 'SESSION' | 'LEAST_LOADED' } = {},
  ) =>
    affinityKey({
      policy: o.policy ?? 'PREFIX',
      route: '/chat/completions',
      body: b,
      headers: {},
      scope: o.scope ?? 'user-1',
      adapter: '',
    });

  it("is the same for every turn of a conversation and differs between conversations, and between callers' scopes", () => {
    expect(key(body('hello', 'again', 'and again'))).toBe(key(body('hello')));
    expect(key(body('hello'))).not.toBe(key(body('goodbye')));
    expect(key(body('hello'), { scope: 'user-2' })).not.toBe(key(body('hello')));
  });

  it('prefers a session key; SESSION routes only by one; LEAST_LOADED and embeddings have none', () => {
    const withSession = { ...body('hello'), prompt_cache_key: 'agent-run-7' };
    expect(key(withSession)).toBe(key({ ...body('other'), prompt_cache_key: 'agent-run-7' }));
    expect(key(body('hello'), { policy: 'SESSION' })).toBeUndefined();
    expect(key(withSession, { policy: 'SESSION' })).toBe(key(withSession));
    expect(key(withSession, { policy: 'LEAST_LOADED' })).toBeUndefined();
    expect(
      affinityKey({
        policy: 'PREFIX',
        route: '/embeddings',
        body: { input: 'x' },
        headers: {},
        scope: 's',
        adapter: '',
      }),
    ).toBeUndefined();
    const header = affinityKey({
      policy: 'SESSION',
      route: '/chat/completions',
      body: body('x'),
      headers: { 'x-session-id': 'agent-run-7' },
      scope: 'user-1',
      adapter: '',
    });
    expect(header).toBe(key(withSession));
  });
});
