import fs from 'node:fs';
import path from 'node:path';

// The scanner behind table-owners.test.ts: which tables a source touches, and which of those a domain does not
// own. Kept out of the test file so a script can run it over another tree (an older commit's server/src).

export type Kind = 'read' | 'write';
export type Access = { table: string; kind: Kind; line: number; via: 'prisma' | 'sql' };
export type Crossing = { file: string; table: string; kind: Kind };

const WRITES = ['create', 'createMany', 'update', 'updateMany', 'upsert', 'delete', 'deleteMany'];
const READS = ['findMany', 'findFirst', 'findUnique', 'findFirstOrThrow', 'findUniqueOrThrow', 'count', 'aggregate'];
const METHODS = [...WRITES, ...READS, 'groupBy'];

const camel = (model: string) => model.charAt(0).toLowerCase() + model.slice(1);

/** The line a character offset is on, 1-based. */
const lineOf = (source: string, at: number) => source.slice(0, at).split('\n').length;

/**
 * Every table a source touches: Prisma delegates (`db.mirrorFile.findMany(`, across line breaks too) and raw SQL
 * naming a table in double quotes, as PostgreSQL needs for Prisma's PascalCase names. Code here quotes strings
 * with single quotes, so `"MirrorFile"` outside a comment is SQL (a template passed to $queryRaw/$executeRaw,
 * or a constant later handed to their Unsafe forms). SQL is a write where the name follows INSERT INTO, UPDATE
 * or DELETE FROM, a read elsewhere (FROM, JOIN, a column qualified by its table).
 */
export function scanSource(source: string, models: readonly string[]): Access[] {
  // Comments name tables in prose; blank them, keeping the line count. Only whole-line comments: `//` inside a
  // string (a URL) must stay.
  const code = source
    .split('\n')
    .map((l) => (/^\s*(\/\/|\*|\/\*)/.test(l) ? '' : l))
    .join('\n');
  const found: Access[] = [];
  const byCamel = new Map(models.map((m) => [camel(m), m]));
  const delegate = new RegExp(
    `\\.\\s*(${[...byCamel.keys()].join('|')})\\s*\\.\\s*(${METHODS.join('|')})\\s*(?:<[^>(]*>)?\\s*\\(`,
    'g',
  );
  for (const m of code.matchAll(delegate)) {
    const [, delegateName = '', method = ''] = m;
    const table = byCamel.get(delegateName) as string;
    found.push({ table, kind: WRITES.includes(method) ? 'write' : 'read', line: lineOf(code, m.index), via: 'prisma' });
  }
  const sql = new RegExp(`(INSERT\\s+INTO\\s+|UPDATE\\s+|DELETE\\s+FROM\\s+)?"(${models.join('|')})"(?!\\s*:)`, 'gi');
  for (const m of code.matchAll(sql)) {
    // Names are case-sensitive in quotes; the keywords are not.
    const [, writes, table = ''] = m;
    if (!models.includes(table)) continue;
    found.push({ table, kind: writes ? 'write' : 'read', line: lineOf(code, m.index), via: 'sql' });
  }
  return found;
}

function tsFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return tsFiles(p);
    return e.name.endsWith('.ts') && !e.name.endsWith('.test.ts') ? [p] : [];
  });
}

/** Every access from a domain folder (server/src/<domain>/…, not tests, not generated) to a table it does not own. */
export function crossings(root: string, owners: Readonly<Record<string, string>>): (Crossing & Access)[] {
  const models = Object.keys(owners);
  const out: (Crossing & Access)[] = [];
  for (const domain of fs.readdirSync(root, { withFileTypes: true })) {
    if (!domain.isDirectory() || domain.name === 'generated') continue;
    for (const file of tsFiles(path.join(root, domain.name))) {
      const rel = path.relative(root, file).split(path.sep).join('/');
      for (const a of scanSource(fs.readFileSync(file, 'utf8'), models)) {
        if (owners[a.table] !== domain.name) out.push({ ...a, file: rel });
      }
    }
  }
  return out;
}

export const key = (c: Crossing) => `${c.file} ${c.table} ${c.kind}`;

/** Crossings found that the list lacks (new), and listed ones no longer found (stale: remove them). */
export function compare(found: (Crossing & Access)[], allowed: Crossing[]): { new: string[]; stale: string[] } {
  const seen = new Map<string, number>();
  for (const c of found) if (!seen.has(key(c))) seen.set(key(c), c.line);
  const listed = new Set(allowed.map(key));
  return {
    new: [...seen]
      .filter(([k]) => !listed.has(k))
      .map(([k, line]) => `${k} (line ${line})`)
      .sort(),
    stale: [...listed].filter((k) => !seen.has(k)).sort(),
  };
}
