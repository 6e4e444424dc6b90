import fs from 'node:fs';
import path from 'node:path';

// The scanner behind table-owners.test.ts: which tables a source touches, and which of those a domain does not
// own. Kept out of the test file so a script can run it over another tree (an older commit's server/src).

export type Kind = 'read' | 'write';
export type Access = { table: string; kind: Kind; line: number; via: 'prisma' | 'sql' | 'nested' };
/** Each model's relation fields and the model each points to, as schema.prisma declares them. */
export type Relations = Readonly<Record<string, Readonly<Record<string, string>>>>;
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
export function scanSource(source: string, models: readonly string[], relations: Relations = {}): Access[] {
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
    // What the call's own argument joins in: `include: { user: true }` reads the users table too.
    const open = m.index + m[0].length;
    for (const n of nestedReads(code, open, table, relations)) {
      found.push({ table: n.table, kind: 'read', line: lineOf(code, n.at), via: 'nested' });
    }
  }
  // A Pothos type's relation fields (`t.relation('node')` on builder.prismaObject('TrainJob', …)) read the related
  // table when a query asks for them, through Pothos's own loader.
  const objects = [...code.matchAll(/\bprisma(?:Object|Node)\s*\(\s*'(\w+)'/g)];
  objects.forEach((o, i) => {
    const model = o[1] as string;
    const end = objects[i + 1]?.index ?? code.length;
    const body = code.slice(o.index, end);
    for (const r of body.matchAll(/\bt\.(?:relation|relatedConnection|relationCount)\s*\(\s*'(\w+)'/g)) {
      const target = relations[model]?.[r[1] as string];
      if (target) found.push({ table: target, kind: 'read', line: lineOf(code, o.index + r.index), via: 'nested' });
    }
    // A field's own `select: { user: { select: { email: true } } }`, which Pothos adds to the type's query.
    for (const sel of body.matchAll(/\bselect\s*:\s*\{/g)) {
      for (const n of selectionReads(code, o.index + sel.index + sel[0].length - 1, model, relations)) {
        found.push({ table: n.table, kind: 'read', line: lineOf(code, n.at), via: 'nested' });
      }
    }
  });
  const sql = new RegExp(`(INSERT\\s+INTO\\s+|UPDATE\\s+|DELETE\\s+FROM\\s+)?"(${models.join('|')})"(?!\\s*:)`, 'gi');
  for (const m of code.matchAll(sql)) {
    // Names are case-sensitive in quotes; the keywords are not.
    const [, writes, table = ''] = m;
    if (!models.includes(table)) continue;
    found.push({ table, kind: writes ? 'write' : 'read', line: lineOf(code, m.index), via: 'sql' });
  }
  return found;
}

/** The relation fields of every model in a schema.prisma: a field whose type is another model (or a list of one). */
export function relationsOf(schema: string): Relations {
  const models = [...schema.matchAll(/^model\s+(\w+)\s*\{([^}]*)\}/gm)];
  const names = new Set(models.map((m) => m[1] ?? ''));
  const out: Record<string, Record<string, string>> = {};
  for (const [, model = '', body = ''] of models) {
    const fields: Record<string, string> = {};
    for (const [, field = '', type = ''] of body.matchAll(/^\s*(\w+)\s+(\w+)(?:\[\]|\?)?(?=\s|$)/gm)) {
      if (names.has(type)) fields[field] = type;
    }
    out[model] = fields;
  }
  return out;
}

/**
 * The tables a Prisma call's argument reads besides its own: relations named under `include` or `select`, at any
 * depth (`include: { replicas: { include: { node: true } } }`), and `_count: { select: { … } }`. Only what is
 * written out as an object literal in the call: an argument built elsewhere (a variable, a spread such as Pothos's
 * `...query`) is not seen, nor a relation filter in `where` or a nested write in `data`.
 */
function nestedReads(code: string, open: number, model: string, relations: Relations): { table: string; at: number }[] {
  const arg = skipSpace(code, open);
  if (code[arg] !== '{') return [];
  return objectReads(code, arg, model, relations);
}

function objectReads(code: string, at: number, model: string, relations: Relations): { table: string; at: number }[] {
  return entries(code, at).flatMap((entry) =>
    (entry.key === 'include' || entry.key === 'select') && code[entry.value] === '{'
      ? selectionReads(code, entry.value, model, relations)
      : [],
  );
}

/** The relations an `include` or `select` object (opening at `at`) of `model` names, and what they name in turn. */
function selectionReads(
  code: string,
  at: number,
  model: string,
  relations: Relations,
): { table: string; at: number }[] {
  const out: { table: string; at: number }[] = [];
  for (const field of entries(code, at)) {
    if (field.key === '_count' && code[field.value] === '{') {
      for (const c of entries(code, field.value)) {
        if (c.key !== 'select' || code[c.value] !== '{') continue;
        for (const counted of entries(code, c.value)) {
          const target = relations[model]?.[counted.key];
          if (target) out.push({ table: target, at: counted.at });
        }
      }
      continue;
    }
    const target = relations[model]?.[field.key];
    if (!target) continue;
    out.push({ table: target, at: field.at });
    if (code[field.value] === '{') out.push(...objectReads(code, field.value, target, relations));
  }
  return out;
}

function skipSpace(code: string, at: number): number {
  let i = at;
  while (i < code.length && /\s/.test(code[i] as string)) i++;
  return i;
}

/**
 * The `key: value` entries of the object literal that opens at `at` ('{'): each key, where it is, and where its
 * value starts. Strings, template literals and nested brackets are stepped over; shorthand and spreads are skipped.
 */
function entries(code: string, at: number): { key: string; at: number; value: number }[] {
  const out: { key: string; at: number; value: number }[] = [];
  let depth = 0;
  let i = at;
  let entryStart = at + 1;
  // A key may follow comments (`// why`, on the line before it).
  const take = (from: number, to: number) => {
    const m = /^((?:\s|\/\/[^\n]*\n|\/\*[\s\S]*?\*\/)*)(['"]?)(\w+)\2\s*:/.exec(code.slice(from, to));
    if (m)
      out.push({ key: m[3] as string, at: from + (m[1] as string).length, value: skipSpace(code, from + m[0].length) });
  };
  for (; i < code.length; i++) {
    const c = code[i] as string;
    if (c === "'" || c === '"' || c === '`') {
      i = endOfString(code, i);
      continue;
    }
    if (c === '/' && code[i + 1] === '/') {
      i = code.indexOf('\n', i) < 0 ? code.length : code.indexOf('\n', i);
      continue;
    }
    if (c === '/' && code[i + 1] === '*') {
      i = code.indexOf('*/', i) < 0 ? code.length : code.indexOf('*/', i) + 1;
      continue;
    }
    if (c === '{' || c === '[' || c === '(') depth++;
    else if (c === '}' || c === ']' || c === ')') {
      depth--;
      if (depth === 0) {
        take(entryStart, i);
        return out;
      }
    } else if (c === ',' && depth === 1) {
      take(entryStart, i);
      entryStart = i + 1;
    }
  }
  return out;
}

/** Where a string or template literal that opens at `at` ends (its closing quote). */
function endOfString(code: string, at: number): number {
  const quote = code[at];
  let depth = 0;
  for (let i = at + 1; i < code.length; i++) {
    const c = code[i];
    if (c === '\\') i++;
    else if (quote === '`' && c === '$' && code[i + 1] === '{') {
      depth++;
      i++;
    } else if (quote === '`' && c === '}' && depth > 0) depth--;
    else if (c === quote && depth === 0) return i;
  }
  return code.length;
}

function tsFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return tsFiles(p);
    return e.name.endsWith('.ts') && !e.name.endsWith('.test.ts') ? [p] : [];
  });
}

/** Every access from a domain folder (server/src/<domain>/…, not tests, not generated) to a table it does not own. */
export function crossings(
  root: string,
  owners: Readonly<Record<string, string>>,
  relations: Relations = {},
): (Crossing & Access)[] {
  const models = Object.keys(owners);
  const out: (Crossing & Access)[] = [];
  for (const domain of fs.readdirSync(root, { withFileTypes: true })) {
    if (!domain.isDirectory() || domain.name === 'generated') continue;
    for (const file of tsFiles(path.join(root, domain.name))) {
      const rel = path.relative(root, file).split(path.sep).join('/');
      for (const a of scanSource(fs.readFileSync(file, 'utf8'), models, relations)) {
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
