import type { Logger } from '@hangar/common/log';
import { isDatabaseUnreachable } from '../db/outage.js';
import type { PubSub } from '../pubsub.js';
import { onLocalNotify } from '../pubsub.js';

// An API token or a session is looked up in the database on every request, which for a script polling a
// trivial query costs more than the query itself. So what a lookup found is kept here for a few seconds, under
// the same rules as the gateway's callers (gateway/callers.ts): dropped at once when the 'credentials' event
// names its user (a token revoked, the user disabled, demoted or signed out), never used while this process
// hears no events (a revocation it cannot hear must not stand for seconds more), never kept when the lookup
// straddled a change, and never served past the credential's own expiry. The one exception: while a lookup
// finds no database at all, a recent answer stands (OUTAGE_KEEP_MS), so /v1 keeps serving through an outage.

const KEEP_MS = 5000;
/**
 * While PostgreSQL cannot be reached, an answer looked up this recently still stands, so that the callers of a
 * running application keep being served from memory through a database restart or failover. No revocation can be
 * committed while the database is down; one committed where this process cannot reach it (a network partition)
 * stands at most this long.
 */
const OUTAGE_KEEP_MS = 60_000;
const MAX_KEPT = 10_000;

/** What a lookup found that may be kept: whose it is, and until when it stands on its own. */
export type Keepable = { userId: string; expiresAt: Date | null };

export type CredentialEvents = {
  pubsub: PubSub;
  /**
   * Since when this process has heard the database's events without a break; undefined while it does not. An
   * entry kept before a break is not used after it: an event sent meanwhile was never heard.
   */
  listeningSince: () => number | undefined;
  log: Logger;
};

export class CredentialCache<V> {
  private readonly kept = new Map<string, { at: number; value: V; userId: string; expiresAt: number }>();
  private readonly lookups = new Map<string, Promise<V>>();
  /** When each holder's credentials last changed (for KEEP_MS), so a lookup that straddled it is not kept. */
  private readonly changedAt = new Map<string, number>();
  /**
   * Holders this process changed whose NOTIFY has not come back yet: between the change's commit and its event
   * a lookup could read the old rows, so nothing of theirs is kept until the event is heard.
   */
  private readonly unsettled = new Map<string, number>();
  private events: CredentialEvents | undefined;
  private stopHearing: (() => void) | undefined;

  /** @param keepable what of a lookup's answer may be kept; undefined for an answer that must not be (a refusal). */
  constructor(private readonly keepable: (value: V) => Keepable | undefined) {}

  /** Starts keeping answers; until then (and after stop) every call looks up. */
  start(events: CredentialEvents): void {
    this.events = events;
    const heard = events.pubsub.subscribe('credentials')[Symbol.asyncIterator]();
    const stopLocal = onLocalNotify((topic, holder) => {
      if (topic !== 'credentials') return;
      this.unsettled.set(holder, Date.now());
      this.changed(holder);
    });
    this.stopHearing = () => {
      stopLocal();
      void heard.return?.();
    };
    void (async () => {
      for (;;) {
        const event = await heard.next();
        if (event.done) return;
        this.unsettled.delete(event.value);
        this.changed(event.value);
      }
    })().catch((err: unknown) => {
      events.log.error('auth: stopped hearing credentials changes; tokens and sessions are looked up every time', {
        error: err,
      });
      this.stop();
    });
  }

  stop(): void {
    this.stopHearing?.();
    this.stopHearing = undefined;
    this.events = undefined;
    this.kept.clear();
  }

  /**
   * The answer kept for this key, or a new one from `load` (one lookup for a burst of callers). `fresh` looks
   * up past what is kept, and keeps what it finds in its place.
   */
  async get(key: string, load: () => Promise<V>, fresh = false): Promise<V> {
    const since = this.stopHearing ? this.events?.listeningSince() : undefined;
    // Not heard from lately: looked up every time (the database's events went unheard), and what is kept
    // answers only if the lookup finds no database (orLastKnown).
    if (since === undefined) {
      return this.orLastKnown(key, async () => {
        const value = await load();
        // Answered by the database itself: what was kept may be a credential revoked since (its event unheard),
        // and must not come back in an outage.
        this.kept.delete(key);
        return value;
      });
    }
    const now = Date.now();
    const hit = this.kept.get(key);
    if (fresh) {
      this.kept.delete(key);
      return this.lookUp(key, load);
    }
    if (hit && now - hit.at < KEEP_MS && hit.at >= since && now < hit.expiresAt) return hit.value;
    if (hit && now - hit.at >= OUTAGE_KEEP_MS) this.kept.delete(key);
    let pending = this.lookups.get(key);
    if (!pending) {
      pending = this.orLastKnown(key, () => this.lookUp(key, load)).finally(() => this.lookups.delete(key));
      this.lookups.set(key, pending);
    }
    return pending;
  }

  /** `load`'s answer; when it finds no database, the answer kept for `key` if it is recent (OUTAGE_KEEP_MS). */
  private async orLastKnown(key: string, load: () => Promise<V>): Promise<V> {
    try {
      return await load();
    } catch (err) {
      const hit = this.kept.get(key);
      const now = Date.now();
      if (hit && isDatabaseUnreachable(err) && now - hit.at < OUTAGE_KEEP_MS && now < hit.expiresAt) return hit.value;
      throw err;
    }
  }

  private async lookUp(key: string, load: () => Promise<V>): Promise<V> {
    const startedAt = Date.now();
    const value = await load();
    const keep = this.keepable(value);
    if (!keep) {
      // Refused now (revoked, demoted, expired): an older acceptance must not answer for it in an outage.
      this.kept.delete(key);
      return value;
    }
    const holder = `user:${keep.userId}`;
    const unsettledAt = this.unsettled.get(holder);
    // A rolled-back change sends no event: its holder is kept again after KEEP_MS.
    const unsettled = unsettledAt !== undefined && Date.now() - unsettledAt < KEEP_MS;
    const since = this.stopHearing ? this.events?.listeningSince() : undefined;
    if (!unsettled && since !== undefined && since <= startedAt && (this.changedAt.get(holder) ?? 0) < startedAt) {
      if (this.kept.size >= MAX_KEPT) this.kept.clear();
      const expiresAt = keep.expiresAt?.getTime() ?? Number.POSITIVE_INFINITY;
      this.kept.set(key, { at: Date.now(), value, userId: keep.userId, expiresAt });
    }
    return value;
  }

  private changed(holder: string): void {
    const now = Date.now();
    this.changedAt.set(holder, now);
    for (const [h, at] of this.changedAt) if (now - at > KEEP_MS) this.changedAt.delete(h);
    for (const [h, at] of this.unsettled) if (now - at > KEEP_MS) this.unsettled.delete(h);
    for (const [key, entry] of this.kept) if (`user:${entry.userId}` === holder) this.kept.delete(key);
  }
}
