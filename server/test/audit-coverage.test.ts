import fs from 'node:fs/promises';
import {
  buildSchema,
  type GraphQLArgument,
  type GraphQLInputType,
  getNamedType,
  isEnumType,
  isInputObjectType,
  isListType,
  isNonNullType,
  isScalarType,
} from 'graphql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// Every mutation, whatever it does, must leave an audit event when it is refused. Rather than trust each new
// mutation to remember, this calls every one the schema has as an anonymous caller with well-formed arguments.

let t: TestApp;
beforeAll(async () => {
  t = await startTestApp();
});
afterAll(() => t.close());

function sample(type: GraphQLInputType): unknown {
  if (isNonNullType(type)) return sample(type.ofType);
  if (isListType(type)) return [sample(type.ofType)];
  if (isEnumType(type)) return type.getValues()[0]?.value;
  if (isInputObjectType(type)) {
    return Object.fromEntries(
      Object.values(type.getFields())
        .filter((f) => isNonNullType(f.type))
        .map((f) => [f.name, sample(f.type)]),
    );
  }
  if (isScalarType(type)) {
    const samples: Record<string, unknown> = {
      String: 'sample',
      ID: '00000000-0000-4000-8000-000000000000',
      Int: 1,
      Float: 1,
      Boolean: false,
      Bytes: 1,
      DateTime: '2999-01-01T00:00:00Z',
      JSON: {},
    };
    return samples[type.name];
  }
  return null;
}

// Read from the committed SDL (which a test keeps equal to the code's schema): the test runner may load the
// server's copy of graphql apart from this file's, and graphql refuses to mix types across copies.
const schema = buildSchema(await fs.readFile(new URL('../schema.graphql', import.meta.url), 'utf8'));
const mutations = Object.values(schema.getMutationType()?.getFields() ?? {}).filter((f) => f.name !== 'login');

it('covers every mutation', () => {
  expect(mutations.length).toBeGreaterThan(5);
});

it.each(mutations.map((f) => [f.name, f] as const))(
  '%s refuses an anonymous caller, typed and audited',
  async (name, field) => {
    const args = field.args as readonly GraphQLArgument[];
    const varDefs = args.map((a) => `$${a.name}: ${a.type.toString()}`).join(', ');
    const callArgs = args.map((a) => `${a.name}: $${a.name}`).join(', ');
    const variables = Object.fromEntries(args.map((a) => [a.name, sample(a.type)]));
    const isUnion = getNamedType(field.type).toString().endsWith('Result');
    const selection = isUnion ? '{ __typename ... on Error { message } }' : '';
    const query = `mutation${varDefs ? `(${varDefs})` : ''} { ${name}${callArgs ? `(${callArgs})` : ''} ${selection} }`;
    const before = await t.app.db.prisma.auditEvent.count({ where: { action: name } });
    const r = await t.gql(query, variables);
    expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
    expect(r.data?.[name].__typename).toBe('UnauthenticatedError');
    const events = await t.app.db.prisma.auditEvent.findMany({ where: { action: name }, orderBy: { id: 'desc' } });
    expect(events.length).toBe(before + 1);
    expect(events[0]).toMatchObject({ outcome: 'REFUSED', actor: 'anonymous' });
  },
);
