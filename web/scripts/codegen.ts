// The console's generated files, each made from a source of truth that lives elsewhere:
// - src/routeTree.gen.ts from the route files in src/routes (TanStack Router's generator, configured by
//   tsr.config.json, the same configuration the Vite plugin reads);
// - src/generated/schema.json from the server's printed schema, so graphcache knows the unions and interfaces;
// - src/graphql-env.d.ts from the same schema, gql.tada's types for every document (src/graphql/graphql.ts),
//   written by its CLI as configured in tsconfig.json's plugin entry.
// `pnpm generate` writes all three; src/generated.test.ts fails when a committed copy drifts from a fresh one.
import { execFileSync } from 'node:child_process';
import { cp, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Generator, getConfig } from '@tanstack/router-generator';
import { minifyIntrospectionQuery } from '@urql/introspection';
import { buildSchema, introspectionFromSchema } from 'graphql';

export const webDir = fileURLToPath(new URL('..', import.meta.url));
export const schemaSdlPath = path.resolve(webDir, '../server/schema.graphql');
export const schemaJsonPath = path.join(webDir, 'src/generated/schema.json');
export const routeTreePath = path.join(webDir, 'src/routeTree.gen.ts');
export const graphqlEnvPath = path.join(webDir, 'src/graphql-env.d.ts');

/** Writes gql.tada's types for the schema to `output` (src/graphql-env.d.ts unless told). */
export function writeGraphqlEnv(output = graphqlEnvPath): void {
  execFileSync('pnpm', ['exec', 'gql.tada', 'generate', 'output', '--output', output], { cwd: webDir, stdio: 'pipe' });
}

/** gql.tada's types as a fresh generation makes them, written elsewhere, the working tree untouched. */
export async function renderGraphqlEnv(): Promise<string> {
  const scratch = await mkdtemp(path.join(tmpdir(), 'hangar-web-tada-'));
  try {
    const output = path.join(scratch, 'graphql-env.d.ts');
    writeGraphqlEnv(output);
    return await readFile(output, 'utf8');
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** The minified introspection graphcache needs: object fields, unions and interfaces (no descriptions). */
export async function renderSchemaJson(): Promise<string> {
  const schema = buildSchema(await readFile(schemaSdlPath, 'utf8'));
  return `${JSON.stringify(minifyIntrospectionQuery(introspectionFromSchema(schema)))}\n`;
}

/** Regenerates src/routeTree.gen.ts in place (and lets the generator fix route files it owns). */
export async function writeRouteTree(): Promise<void> {
  const config = getConfig({ disableLogging: true, tmpDir: path.join(webDir, '.tanstack/tmp') }, webDir);
  await new Generator({ config, root: webDir }).run();
}

/** A fresh route tree made from a copy of src/routes, without touching the working tree. */
export async function renderRouteTree(): Promise<string> {
  const scratch = await mkdtemp(path.join(tmpdir(), 'hangar-routes-'));
  try {
    await cp(path.join(webDir, 'src/routes'), path.join(scratch, 'src/routes'), { recursive: true });
    await cp(path.join(webDir, 'tsr.config.json'), path.join(scratch, 'tsr.config.json'));
    const config = getConfig({ disableLogging: true, tmpDir: path.join(scratch, '.tmp') }, scratch);
    await new Generator({ config, root: scratch }).run();
    return await readFile(path.join(scratch, 'src/routeTree.gen.ts'), 'utf8');
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}
