import { readFileSync } from 'node:fs';
import { SourceMap } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

// A stack trace from a bundle (the server's dist/main.js) put back to the TypeScript files, lines and columns, as
// `node --enable-source-maps` prints it. That flag decodes the map of every bundle as it loads and keeps it for
// good: 3 MiB of an idle server's heap (bench/subscriptions.ts), spent before a stack is ever printed. Here a
// bundle's map is read at the first stack that passes through it and kept from then on.

/** A frame's place: a path or file: URL of a .js/.mjs/.cjs file, its line and column (1-based, as V8 writes them). */
const PLACE = /((?:file:\/\/)?\/[^\s()]+?\.[cm]?js):(\d+):(\d+)/g;
/** A line of the stack that is a frame, as V8 writes them ("    at fn (place)"). */
const FRAME = /^ {4}at .*$/gm;

/** Each bundle's decoded map, or null for a file that has none beside it (read once either way). */
const maps = new Map<string, { map: SourceMap; base: URL } | null>();

function mapOf(file: string) {
  // Only ours: a package's frames stay as Node names them. Some ship maps of megabytes (Prisma's runtime), which
  // the first error through them would read and then hold for good.
  if (file.includes('/node_modules/')) return null;
  let known = maps.get(file);
  if (known !== undefined) return known;
  try {
    const path = file.startsWith('file:') ? fileURLToPath(file) : file;
    const payload = JSON.parse(readFileSync(`${path}.map`, 'utf8'));
    known = { map: new SourceMap(payload), base: pathToFileURL(`${path}.map`) };
  } catch {
    known = null;
  }
  maps.set(file, known);
  return known;
}

/**
 * The stack with every frame that lies in a bundle of ours with a source map beside it (`<file>.map`) named by
 * its original source; other frames (Node's own, a package's, a stack already mapped) are left as they are.
 */
export function sourceMappedStack(stack: string): string {
  // Frames only: the message above them may quote a caller's text, whose "paths" must not be read (nor kept).
  return stack.replace(FRAME, (frame) => frame.replace(PLACE, mapPlace));
}

function mapPlace(place: string, file: string, line: string, column: string): string {
  const found = mapOf(file);
  if (!found) return place;
  const entry = found.map.findEntry(Number(line) - 1, Number(column) - 1) as {
    originalSource?: string;
    originalLine?: number;
    originalColumn?: number;
  };
  if (entry.originalSource === undefined || entry.originalLine === undefined) return place;
  // Sources are relative to the map; a virtual one (an esbuild plugin's "namespace:path") stays as it is.
  const source = /^[a-z-]+:/.test(entry.originalSource)
    ? entry.originalSource
    : fileURLToPath(new URL(entry.originalSource, found.base));
  return `${source}:${entry.originalLine + 1}:${(entry.originalColumn ?? 0) + 1}`;
}
