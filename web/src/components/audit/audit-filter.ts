import { z } from 'zod';

export const auditOutcomes = ['DONE', 'REFUSED', 'FAILED'] as const;

/**
 * What the audit page keeps in the URL, so a search survives a reload and can be sent to a colleague: parts of
 * the actor, action and target, the outcome, and a time range (ISO times). A value that does not parse is dropped
 * rather than failing the page.
 */
export const auditSearch = z.object({
  actor: z.string().max(200).optional().catch(undefined),
  action: z.string().max(100).optional().catch(undefined),
  target: z.string().max(300).optional().catch(undefined),
  outcome: z.enum(auditOutcomes).optional().catch(undefined),
  from: z.iso.datetime({ offset: true }).optional().catch(undefined),
  to: z.iso.datetime({ offset: true }).optional().catch(undefined),
});

export type AuditSearch = z.infer<typeof auditSearch>;

/** The server's AuditFilter from the URL's search: empty fields left out, so "no filter" is one cache entry. */
export function auditFilterOf(search: AuditSearch): AuditSearch | null {
  const entries = Object.entries(search).filter(([, v]) => typeof v === 'string' && v.trim() !== '');
  return entries.length
    ? (Object.fromEntries(entries.map(([k, v]) => [k, (v as string).trim()])) as AuditSearch)
    : null;
}
