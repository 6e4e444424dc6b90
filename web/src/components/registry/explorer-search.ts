import { z } from 'zod';

export const registrySorts = ['downloads', 'likes', 'lastModified'] as const;
export type RegistrySort = (typeof registrySorts)[number];

/**
 * What the registry explorer keeps in the URL, so a reload or a shared link shows the same search and the same
 * open repository: `q` the search (empty: everything, by the sort), `repo` the repository open beneath its row,
 * `ctx` the context the memory estimates use (absent: each model's own), `job` the serve job it shows. A value that does not parse is dropped
 * rather than failing the page.
 */
export const explorerSearch = z.object({
  q: z.string().max(200).optional().catch(undefined),
  sort: z.enum(registrySorts).optional().catch(undefined),
  repo: z.string().max(200).optional().catch(undefined),
  ctx: z.number().int().positive().optional().catch(undefined),
  /** A serve job started from the open repository: a reload shows its steps again. */
  job: z.string().max(100).optional().catch(undefined),
});

export type ExplorerSearch = z.infer<typeof explorerSearch>;

/** How the explorer asks for the next state: a new search is a new history entry, the rest replace the current. */
export type ExplorerNavigate = (next: ExplorerSearch, how?: { push?: boolean }) => void;
