import fs from 'node:fs/promises';
import path from 'node:path';
import {
  buildSchema,
  type DefinitionNode,
  type GraphQLSchema,
  isInputObjectType,
  isObjectType,
  Kind,
  type OperationDefinitionNode,
  parse,
  print,
  validate,
} from 'graphql';
import { createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from './harness.js';

// Every GraphQL example in README.md and docs/*.md, run against a real server as the admin: an example that no
// longer matches the schema (a renamed field, an argument made required, two fields of one name but different
// types in one selection) fails here instead of in the hands of the operator who copied it.
//
// What counts as an example: each ```graphql block (its operations, in order; a block of type definitions is
// compared with the schema instead), and the queries inside ```sh blocks (curl's -d '{"query": …}') and ```js
// blocks (query: '…'). A "…" in an example stands for what the reader fills in: an id is filled with the id the
// example before it in the same block returned; any other "…" is left as written, and the server must still
// answer it with data (a typed error in the result union counts: it is an answer, not a broken example).

const root = path.resolve(import.meta.dirname, '../..');

type Example = { file: string; line: number; query: string; variables?: Record<string, unknown> };
type Block = { file: string; line: number; lang: string; text: string };

async function docFiles(): Promise<string[]> {
  const docs = (await fs.readdir(path.join(root, 'docs'))).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`);
  return ['README.md', ...docs.sort()];
}

async function blocks(): Promise<Block[]> {
  const out: Block[] = [];
  for (const file of await docFiles()) {
    const text = await fs.readFile(path.join(root, file), 'utf8');
    for (const m of text.matchAll(/^ *```(\w+)\n([\s\S]*?)^ *```/gm)) {
      out.push({ file, line: text.slice(0, m.index).split('\n').length, lang: m[1] ?? '', text: m[2] ?? '' });
    }
  }
  return out;
}

/** The GraphQL in a shell or JavaScript block: curl's JSON body, or a client's `query: '…'`. */
function embedded(b: Block): Example[] {
  const found: Example[] = [];
  if (b.lang === 'sh' || b.lang === 'bash') {
    for (const m of b.text.matchAll(/-d '(\{"query".*?\})'/g)) {
      const body = JSON.parse(m[1] ?? '{}') as { query: string; variables?: Record<string, unknown> };
      found.push({ file: b.file, line: b.line, query: body.query, variables: body.variables });
    }
  }
  if (b.lang === 'js' || b.lang === 'ts' || b.lang === 'javascript') {
    for (const m of b.text.matchAll(/query:\s*'([^']+)'/g))
      found.push({ file: b.file, line: b.line, query: m[1] ?? '' });
  }
  return found;
}

const isOperation = (d: DefinitionNode): d is OperationDefinitionNode => d.kind === Kind.OPERATION_DEFINITION;

let t: TestApp;
let url: string;
let token: string;
let all: Block[];
// The printed schema (committed, and checked against the code by test/generated.test.ts), built with this file's
// copy of graphql: Yoga's schema object belongs to another copy, which graphql's validate() refuses.
let schema: GraphQLSchema;

beforeAll(async () => {
  schema = buildSchema(await fs.readFile(path.join(root, 'server/schema.graphql'), 'utf8'));
  t = await startTestApp();
  url = await t.app.start();
  token = await t.token('ADMIN', 'docs-examples');
  all = await blocks();
});
afterAll(() => t.close());

async function run(query: string, variables?: Record<string, unknown>) {
  const r = await t.gql(query, variables, { token });
  return { data: r.data, errors: r.errors };
}

/** A subscription over graphql-ws, its official client: what it answers first (or that it is listening, quietly). */
async function subscribe(query: string): Promise<{ errors?: unknown; data?: unknown; listening?: true }> {
  const client = createClient({
    url: `${url.replace('http', 'ws')}/graphql`,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${token}` },
    retryAttempts: 0,
  });
  try {
    return await new Promise((resolve) => {
      // Quiet for a second after the server took it: a subscription waiting for its first change, as it should.
      const quiet = setTimeout(() => resolve({ listening: true }), 1000);
      client.subscribe(
        { query },
        {
          next: (value) => {
            clearTimeout(quiet);
            resolve(value as { data?: unknown; errors?: unknown });
          },
          error: (errors) => {
            clearTimeout(quiet);
            resolve({ errors });
          },
          complete: () => {},
        },
      );
    });
  } finally {
    await client.dispose();
  }
}

/** The first `id` anywhere in an answer. */
function firstId(value: unknown): string | undefined {
  if (!value || typeof value !== 'object') return undefined;
  const o = value as Record<string, unknown>;
  if (typeof o.id === 'string') return o.id;
  for (const v of Object.values(o)) {
    const id = firstId(v);
    if (id) return id;
  }
  return undefined;
}

describe('the examples in README.md and docs/', () => {
  it('finds the examples (a change to how they are written must not make this test check nothing)', () => {
    const graphql = all.filter((b) => b.lang === 'graphql');
    expect(graphql.length).toBeGreaterThanOrEqual(5);
    expect(all.flatMap(embedded).length).toBeGreaterThanOrEqual(3);
  });

  it('runs every operation, in order, and each is answered with data and no errors', async () => {
    const failures: string[] = [];
    for (const block of all) {
      const examples: Example[] =
        block.lang === 'graphql'
          ? parse(block.text)
              .definitions.filter(isOperation)
              .map((op) => ({ file: block.file, line: block.line, query: print(op) }))
          : embedded(block);
      let lastId: string | undefined;
      for (const ex of examples) {
        const where = `${ex.file}:${ex.line}: ${ex.query.replace(/\s+/g, ' ').slice(0, 90)}`;
        const query = lastId ? ex.query.replace(/(\bid: )"…"/g, `$1"${lastId}"`) : ex.query;
        const document = parse(query);
        const invalid = validate(schema, document);
        if (invalid.length) {
          failures.push(`${where}\n    ${invalid.map((e) => e.message).join('\n    ')}`);
          continue;
        }
        const subscription = (document.definitions[0] as OperationDefinitionNode).operation === 'subscription';
        const answer = subscription ? await subscribe(query) : await run(query, ex.variables);
        if ('errors' in answer && answer.errors) failures.push(`${where}\n    ${JSON.stringify(answer.errors)}`);
        else if (!('listening' in answer) && !answer.data) failures.push(`${where}\n    no data`);
        lastId = firstId(answer.data) ?? lastId;
      }
    }
    expect(failures).toEqual([]);
  });

  it("writes the schema's types and fields in the docs as the schema has them", () => {
    const failures: string[] = [];
    for (const block of all.filter((b) => b.lang === 'graphql')) {
      const doc = parse(block.text);
      if (doc.definitions.some(isOperation)) continue;
      for (const def of doc.definitions) {
        if (def.kind !== Kind.OBJECT_TYPE_DEFINITION && def.kind !== Kind.INPUT_OBJECT_TYPE_DEFINITION) continue;
        const name = def.name.value;
        const actual = schema.getType(name);
        if (!isObjectType(actual) && !isInputObjectType(actual)) {
          failures.push(`${block.file}:${block.line}: type ${name} is not in the schema`);
          continue;
        }
        const fields = actual.getFields();
        for (const f of def.fields ?? []) {
          const field = f.name.value;
          const real = fields[field];
          if (!real) {
            failures.push(`${block.file}:${block.line}: ${name}.${field} is not in the schema`);
            continue;
          }
          if (String(real.type) !== print(f.type)) {
            failures.push(`${block.file}:${block.line}: ${name}.${field} is ${real.type}, written ${print(f.type)}`);
          }
          const realArgs = 'args' in real ? real.args.map((g) => `${g.name}: ${g.type}`) : [];
          const writtenArgs =
            'arguments' in f ? (f.arguments ?? []).map((g) => `${g.name.value}: ${print(g.type)}`) : [];
          if (realArgs.sort().join(', ') !== writtenArgs.sort().join(', ')) {
            failures.push(
              `${block.file}:${block.line}: ${name}.${field}(${realArgs.join(', ')}), written (${writtenArgs.join(', ')})`,
            );
          }
        }
      }
    }
    expect(failures).toEqual([]);
  });
});
