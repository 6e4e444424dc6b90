// The console's files compressed at build time, next to each file (app-1234.js.br, app-1234.js.gz): the server
// sends those bytes as they are (server/src/http/static.ts) instead of spending a second of brotli 11 on the
// main bundle at every start, on the two cores the start itself needs. Plain JavaScript, like console-stamp.mjs.
import { readdir, readFile, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import zlib from 'node:zlib';

const brotli = promisify(zlib.brotliCompress);
const gzip = promisify(zlib.gzip);

/** Text the browser downloads; images and fonts are compressed already, and source maps are fetched by devtools. */
const TEXT = new Set(['.js', '.mjs', '.css', '.html', '.svg', '.json', '.txt', '.webmanifest']);
/** Under this a compressed copy saves less than its headers cost (the server's MIN_COMPRESSED_BYTES). */
const MIN_BYTES = 1024;

/**
 * Writes file.br (brotli, best) and file.gz (gzip, best) for every text file in dir of at least MIN_BYTES.
 * @param {string} dir
 * @returns {Promise<string[]>} the files compressed, relative to dir
 */
export async function precompress(dir) {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  const done = [];
  for (const e of entries) {
    if (!e.isFile() || !TEXT.has(path.extname(e.name))) continue;
    const file = path.join(e.parentPath, e.name);
    if ((await stat(file)).size < MIN_BYTES) continue;
    const bytes = await readFile(file);
    const [br, gz] = await Promise.all([
      brotli(bytes, {
        params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 11, [zlib.constants.BROTLI_PARAM_SIZE_HINT]: bytes.length },
      }),
      gzip(bytes, { level: 9 }),
    ]);
    await writeFile(`${file}.br`, br);
    await writeFile(`${file}.gz`, gz);
    done.push(path.relative(dir, file));
  }
  return done;
}

/** The Vite plugin: precompresses what every build wrote. */
export function precompressPlugin() {
  return {
    name: 'hangar-precompress',
    /** @type {'build'} */
    apply: 'build',
    /** @param {{ dir?: string }} output */
    async writeBundle(output) {
      if (output.dir) await precompress(output.dir);
    },
  };
}
