import type { AuditOutcome } from './types';

// Beside graphcache's updaters (cache.ts), which decide with it where a live event goes: the audit page's filter
// (components/audit/audit-filter.ts) is this shape, as the server's AuditFilter input is.

/** An AuditFilter as the server takes it: parts of actor, action and target, an outcome, a time range (ISO). */
export type AuditFilterValues = {
  actor?: string | null;
  action?: string | null;
  target?: string | null;
  outcome?: AuditOutcome | null;
  from?: string | null;
  to?: string | null;
};

/**
 * Whether an event belongs to a filtered list, as the server decides it (audit.service.ts): an event that arrives
 * live joins only the lists it would have been in.
 */
export function matchesAuditFilter(
  event: { actor: string; action: string; target: string | null; outcome: AuditOutcome; at: string },
  filter: AuditFilterValues | null | undefined,
): boolean {
  if (!filter) return true;
  const has = (value: string | null, part?: string | null) =>
    !part || (value ?? '').toLowerCase().includes(part.toLowerCase());
  const at = Date.parse(event.at);
  return (
    has(event.actor, filter.actor) &&
    has(event.action, filter.action) &&
    has(event.target, filter.target) &&
    (!filter.outcome || filter.outcome === event.outcome) &&
    (!filter.from || at >= Date.parse(filter.from)) &&
    (!filter.to || at < Date.parse(filter.to))
  );
}
