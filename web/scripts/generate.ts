// pnpm generate: rewrites the console's generated files (see codegen.ts).
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import {
  graphqlEnvPath,
  renderGraphqlEnv,
  renderSchemaJson,
  routeTreePath,
  schemaJsonPath,
  webDir,
  writeRouteTree,
} from './codegen.ts';

async function writeIfChanged(file: string, content: string) {
  const before = await readFile(file, 'utf8').catch(() => undefined);
  if (before === content) return console.log(`unchanged ${path.relative(webDir, file)}`);
  await mkdir(path.dirname(file), { recursive: true });
  await writeFile(file, content);
  console.log(`wrote ${path.relative(webDir, file)}`);
}

await writeIfChanged(schemaJsonPath, await renderSchemaJson());
await writeIfChanged(graphqlEnvPath, await renderGraphqlEnv());
const before = await readFile(routeTreePath, 'utf8').catch(() => undefined);
await writeRouteTree();
const after = await readFile(routeTreePath, 'utf8');
console.log(`${before === after ? 'unchanged' : 'wrote'} ${path.relative(webDir, routeTreePath)}`);
