import fs from 'node:fs';
import path from 'node:path';
import { expect, it } from 'vitest';

// The README and docs/ point operators and contributors at files by path (`mirror/transfer.ts`): a file that moved
// (lib/download/… went to packages/common) leaves them reading about code that is not there. Every path with a
// folder in it must name a file of the checkout, read from the places the docs write paths from.

const ROOT = path.resolve(import.meta.dirname, '..', '..');
const BASES = ['', 'server', 'server/src', 'web', 'web/src', 'e2e', 'packages/common/src', 'packages/agent/src'].concat(
  fs.readdirSync(path.join(ROOT, 'packages')).map((p) => `packages/${p}`),
);

it('every file path the README and docs/ name, with its folder, exists', () => {
  const docs = ['README.md', ...fs.readdirSync(path.join(ROOT, 'docs')).map((f) => `docs/${f}`)].filter((f) =>
    f.endsWith('.md'),
  );
  const missing: string[] = [];
  for (const doc of docs) {
    const text = fs.readFileSync(path.join(ROOT, doc), 'utf8');
    for (const [, named] of text.matchAll(/`([A-Za-z0-9_.@-]+(?:\/[A-Za-z0-9_.@-]+)+\.(?:ts|tsx|mjs|cjs|py|sql))`/g)) {
      const p = named as string;
      if (!BASES.some((base) => fs.existsSync(path.join(ROOT, base, p)))) missing.push(`${doc}: ${p}`);
    }
  }
  expect(missing).toEqual([]);
});
