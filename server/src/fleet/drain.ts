import type { Tx } from '../db/client.js';
import { fleetLoad } from '../gateway/load-report.js';
import type { Replica } from '../generated/prisma/client.js';

// Draining: a replica being removed (a scale-down, a mode change, its node leaving) first stops taking requests and
// finishes those it has, and only then is its agent asked to stop it. Stopping at once would cut every answer it is
// streaming: an in-process llama.cpp replica waits for them itself, but llama-server and vLLM are child processes
// that end on SIGTERM mid-answer. The mark is `drainingSince` on the replica row (a column rather than a state:
// the replica is still READY and its agent still runs it; the route table skips it from the next refresh), and
// the placement pass (fleet-placement.ts) asks for the stop once every server's gateway reports nothing in flight
// there, or once HANGAR_DRAIN_GRACE_SECONDS have passed.

/**
 * A replica marked this long ago is known to every server's route table (it refreshes every second) and to the
 * load they publish (every second): a request picked just before the mark is counted by then.
 */
export const DRAIN_SETTLE_MS = 3000;

type Row = Pick<Replica, 'id' | 'state' | 'desired' | 'drainingSince'>;

/** Draining replicas, as the pure placement sees them: asked to stop (not counted, kept again if wanted again). */
export function placementView<R extends Row>(replicas: R[]): R[] {
  return replicas.map((r) => (r.drainingSince && r.desired === 'RUN' ? { ...r, desired: 'STOP' as const } : r));
}

/** How long after its grace an agent that left has to report a drained replica stopped, before it counts as lost. */
const REPORT_MS = 30_000;

/**
 * Still finishing its requests, or asked to stop and not yet reported stopped: not taken for lost while its node
 * is away (an agent that left keeps draining and reports each stop), until its grace and a while more have passed.
 */
export function stillDraining(r: Row, now: Date, graceMs: number): boolean {
  return Boolean(r.drainingSince && now.getTime() - r.drainingSince.getTime() < graceMs + REPORT_MS);
}

/** Whether the placement pass should drain a replica it stops rather than stop it now: one that may hold requests. */
export function drainsFirst(r: Pick<Replica, 'state' | 'nodeId'>, online: ReadonlySet<string>): boolean {
  return r.state === 'READY' && r.nodeId !== null && online.has(r.nodeId);
}

/**
 * Asks the agent to stop each draining replica that holds no request any more (or whose grace ran out), in the
 * placement pass's transaction. Returns how many are still draining.
 */
export async function finishDrains(tx: Tx, replicas: Row[], now: Date, graceMs: number): Promise<number> {
  const draining = replicas.filter((r) => r.drainingSince && r.desired === 'RUN');
  if (!draining.length) return 0;
  const load = await fleetLoad(tx, now);
  let left = 0;
  for (const r of draining) {
    const since = now.getTime() - (r.drainingSince as Date).getTime();
    const held = load.inFlight.get(r.id) ?? 0;
    const drained = since >= DRAIN_SETTLE_MS && held === 0;
    if (!drained && since < graceMs) {
      left++;
      continue;
    }
    const message = drained
      ? `drained: its requests finished within ${Math.ceil(since / 1000)} s; stopping`
      : `stopping after the drain's grace (HANGAR_DRAIN_GRACE_SECONDS, ${Math.round(graceMs / 1000)} s) with ${held} request${held === 1 ? '' : 's'} still in flight`;
    await tx.replica.update({ where: { id: r.id }, data: { desired: 'STOP', message } });
  }
  return left;
}
