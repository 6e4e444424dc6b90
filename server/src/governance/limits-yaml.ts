import fs from 'node:fs/promises';
import { z } from 'zod';
import { limitInput } from './limit-input.js';

// hangar.yaml's `limits:` section, beside its `models:` (catalog/catalog-input.ts): limits an operator keeps in
// version control. Read at every start; the API shows them and refuses to change them (a change made there would
// revert at the next start). A bad entry stops the start with the file, its line and the field:
//
//   limits:
//     - scope: team:acme/research      # key:<token id>, user:<email>, team:<org>/<team>, project:…, org:<org>
//       model: tiny                    # optional: one model or adapter; absent, every model
//       requestsPerMinute: 600
//       tokensPerDay: 2000000
//       spendPerMonth: 150.00

const entryRule = () =>
  z
    .object({ scope: z.string({ error: 'a scope such as team:acme/research' }), model: z.string().nullish() })
    .and(limitInput.partial().passthrough());

export type DeclaredLimit = {
  scope: string;
  model?: string | null;
  limit: z.input<typeof limitInput>;
  line: number;
};

/** The entries of `file`'s limits section with their lines; [] when there is no file or no section. */
export async function readDeclaredLimits(file: string | undefined): Promise<DeclaredLimit[]> {
  if (!file) return [];
  const { parseDocument, LineCounter, isSeq, isMap } = await import('yaml');
  const lines = new LineCounter();
  const text = await fs.readFile(file, 'utf8');
  const doc = parseDocument(text, { lineCounter: lines });
  const section = doc.get('limits', true);
  if (section === undefined || section === null) return [];
  const lineOf = (node: unknown) => {
    const range = (node as { range?: [number, number, number] } | null)?.range;
    return range ? lines.linePos(range[0]).line : 0;
  };
  if (!isSeq(section)) {
    throw new Error(
      `HANGAR_CONFIG=${file}, line ${lineOf(section)}: limits is a list of entries ("- scope: team:acme/research")`,
    );
  }
  const out: DeclaredLimit[] = [];
  for (const item of section.items) {
    const line = lineOf(item);
    if (!isMap(item)) throw new Error(`HANGAR_CONFIG=${file}, line ${line}: a limit is a map with scope and limits`);
    const value = (item as { toJSON(): unknown }).toJSON() as Record<string, unknown>;
    const parsed = entryRule().safeParse(value);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      const key = issue?.path.join('.') || 'entry';
      const at = item.get(String(issue?.path[0] ?? ''), true);
      throw new Error(
        `HANGAR_CONFIG=${file}, line ${at ? lineOf(at) : line} (${key}): ${issue?.message ?? 'not accepted'}`,
      );
    }
    const { scope, model, ...rest } = parsed.data as Record<string, unknown> & { scope: string; model?: string | null };
    const unknown = Object.keys(rest).filter((k) => !(k in limitInput.shape));
    if (unknown.length) {
      throw new Error(
        `HANGAR_CONFIG=${file}, line ${lineOf(item.get(unknown[0] as string, true)) || line}: ${unknown[0]} is not a limit; the kinds are ${Object.keys(limitInput.shape).join(', ')}`,
      );
    }
    out.push({ scope, model, limit: rest as z.input<typeof limitInput>, line });
  }
  return out;
}
