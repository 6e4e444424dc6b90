import { buildSchema, type DocumentNode, validate } from 'graphql';
import { expect, it } from 'vitest';
import sdl from '../../../server/schema.graphql?raw';

// The fake server answers whatever it is sent; the real one first checks each document against its schema. A
// selection it would refuse (a job's nullable `message` beside a refusal's non-null one, in one union) is caught
// here rather than in the browser.
// Every module of the console that may hold a document: the components, the routes, and the client's own.
const modules = import.meta.glob<Record<string, unknown>>(
  ['../components/**/*.{ts,tsx}', '../routes/**/*.tsx', './*.ts', '!**/*.test.{ts,tsx}'],
  {
    eager: true,
  },
);

it('sends only documents the server’s schema accepts', () => {
  const schema = buildSchema(sdl);
  const refused: string[] = [];
  let operations = 0;
  for (const mod of Object.values(modules)) {
    for (const [name, value] of Object.entries(mod)) {
      const doc = value as DocumentNode | null;
      if (doc?.kind !== 'Document' || !doc.definitions.some((d) => d.kind === 'OperationDefinition')) continue;
      operations++;
      for (const e of validate(schema, doc)) refused.push(`${name}: ${e.message}`);
    }
  }
  expect(operations).toBeGreaterThanOrEqual(40);
  expect(refused).toEqual([]);
});

// urql's gql builds the same document with an untyped result, so a view would type the server's answer by hand
// again. biome's noRestrictedImports refuses the import in web/ too; this catches it where lint is not run.
const sources = import.meta.glob<string>(['../**/*.{ts,tsx}', '!**/*.test.{ts,tsx}', '!../graphql-env.d.ts'], {
  eager: true,
  query: '?raw',
  import: 'default',
});

it('writes every document with graphql(), typed from the schema', () => {
  const untyped = Object.entries(sources)
    .filter(([, text]) => /import\s*\{[^}]*\bgql\b[^}]*\}\s*from\s*'(urql|@urql\/core)'/.test(text))
    .map(([path]) => path);
  expect(Object.keys(sources).length).toBeGreaterThanOrEqual(80);
  expect(untyped).toEqual([]);
});
