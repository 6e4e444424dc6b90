import type { LimitKind } from './limits-windows.js';

// Who is being refused, per limit: each refusal counted against its caller (the API token, or the user for a
// console session) in the minute it happened, in this process's memory. Only the current and the previous minute
// are kept, and at most MAX_CALLERS callers per limit and minute (the rest add up under one "other" entry), so a
// flood of refused callers costs a bounded map, whatever its size; the audit log keeps the counts per limit and
// minute for longer.

const MAX_CALLERS = 1000;
export const OTHER_CALLERS = '';

export type Refuser = {
  /** The API token's id; '' for a console session (then userId says who), or for "other" callers. */
  tokenId: string;
  userId: string;
  kinds: LimitKind[];
  count: number;
};

type Minute = { at: number; callers: Map<string, Refuser> };

export class RefusalTally {
  private readonly byLimit = new Map<string, Minute[]>();

  constructor(private readonly deps: { minuteMs: () => number; nowMs: () => number }) {}

  note(limitId: string, kind: LimitKind, caller: { tokenId: string; userId: string }): void {
    const at = Math.floor(this.deps.nowMs() / this.deps.minuteMs());
    const minutes = (this.byLimit.get(limitId) ?? []).filter((m) => m.at >= at - 1);
    let current = minutes.find((m) => m.at === at);
    if (!current) {
      current = { at, callers: new Map() };
      minutes.push(current);
    }
    this.byLimit.set(limitId, minutes);
    let key = caller.tokenId ? `key:${caller.tokenId}` : `user:${caller.userId}`;
    if (!current.callers.has(key) && current.callers.size >= MAX_CALLERS) key = OTHER_CALLERS;
    let seen = current.callers.get(key);
    if (!seen) {
      seen =
        key === OTHER_CALLERS
          ? { tokenId: '', userId: '', kinds: [], count: 0 }
          : { tokenId: caller.tokenId, userId: caller.tokenId ? '' : caller.userId, kinds: [], count: 0 };
      current.callers.set(key, seen);
    }
    seen.count++;
    if (!seen.kinds.includes(kind)) seen.kinds.push(kind);
  }

  /** The `top` callers this limit refused most in the last minute window (the current one and the one before). */
  top(limitId: string, top: number): (Refuser & { since: Date })[] {
    const at = Math.floor(this.deps.nowMs() / this.deps.minuteMs());
    const minutes = (this.byLimit.get(limitId) ?? []).filter((m) => m.at >= at - 1);
    const merged = new Map<string, Refuser>();
    for (const m of minutes) {
      for (const [key, r] of m.callers) {
        const into = merged.get(key);
        if (!into) merged.set(key, { ...r, kinds: [...r.kinds] });
        else {
          into.count += r.count;
          for (const k of r.kinds) if (!into.kinds.includes(k)) into.kinds.push(k);
        }
      }
    }
    const since = new Date((at - 1) * this.deps.minuteMs());
    return [...merged.values()]
      .sort((a, b) => b.count - a.count)
      .slice(0, Math.max(0, top))
      .map((r) => ({ ...r, since }));
  }
}
