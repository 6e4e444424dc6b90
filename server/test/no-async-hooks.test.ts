import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// On Node 20 (our engine) an AsyncLocalStorage in use puts a promise hook on every promise of the process: the
// gateway's added latency, the subscriptions' fan-out and their memory paid for it twice (commit 34adfcc took one
// out of db/client.ts; #27 took the log's out again). What a line or a query belongs to is handed on explicitly
// (an Actor, edge.log, db.loops). This fails when code under server/ or packages/ imports node:async_hooks, so the
// next one is a decision, not an accident.

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, '../..');
const SEARCHED = ['server', 'packages'];
const SKIPPED_DIRS = new Set(['node_modules', 'dist', 'build', 'generated', '.turbo']);
const SOURCE = /\.(ts|tsx|mts|cts|js|mjs|cjs)$/;
// An import or require of async_hooks, with or without node:, static or dynamic.
const IMPORT = /(?:from\s*|import\s*\(\s*|require\s*\(\s*|import\s+)['"](?:node:)?async_hooks['"]/;

/** Files allowed to, with why. Only test tooling that never runs inside the server or the agent. */
const ALLOWED: Record<string, string> = {
  'server/test/sql-count.ts':
    "counts the SQL an in-process request sends (tests and bench/mirror-query.ts): the store lives in the test's process only",
};

function sourcesUnder(dir: string, out: string[] = []): string[] {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (entry.isDirectory()) {
      if (!SKIPPED_DIRS.has(entry.name)) sourcesUnder(path.join(dir, entry.name), out);
    } else if (SOURCE.test(entry.name)) out.push(path.join(dir, entry.name));
  }
  return out;
}

describe('no AsyncLocalStorage in Hangar', () => {
  it('nothing under server/ or packages/ imports node:async_hooks but the listed test tooling', () => {
    const files = SEARCHED.flatMap((d) => sourcesUnder(path.join(root, d)));
    // The walk found the tree (a moved root would pass on nothing).
    expect(files).toContain(path.join(root, 'packages/common/src/log.ts'));
    expect(files).toContain(path.join(root, 'server/src/telemetry/tracing.ts'));
    const importing = files
      .filter((f) => IMPORT.test(fs.readFileSync(f, 'utf8')))
      .map((f) => path.relative(root, f).split(path.sep).join('/'));
    expect(importing.filter((f) => !(f in ALLOWED))).toEqual([]);
    // A listed file that no longer imports it comes off the list.
    expect(Object.keys(ALLOWED).filter((f) => !importing.includes(f))).toEqual([]);
  });
});
