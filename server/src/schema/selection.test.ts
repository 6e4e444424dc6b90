import { buildSchema, type GraphQLResolveInfo, graphql } from 'graphql';
import { describe, expect, it } from 'vitest';
import { asksFor } from './selection.js';

// asksFor is what lets Query.mirror load the versions' users with the versions: a wrong "no" would only cost
// speed, but a wrong answer through a fragment would make the look-ahead useless for the console, which asks
// through fragments.
const schema = buildSchema(`
  type Use { name: String }
  type Version { id: ID, usedBy: [Use] }
  type Family { versions: [Version] }
  type Mirror { families: [Family], versions: [Version] }
  type Query { mirror: Mirror }
`);

async function asked(query: string): Promise<boolean> {
  let answer: boolean | undefined;
  const rootValue = {
    mirror: (_args: unknown, _ctx: unknown, info: GraphQLResolveInfo) => {
      answer = asksFor(info, 'usedBy');
      return { families: [], versions: [] };
    },
  };
  const r = await graphql({ schema, source: query, rootValue });
  expect(r.errors).toBeUndefined();
  return answer as boolean;
}

describe('asksFor', () => {
  it('finds a field asked directly, deep down, through named and inline fragments', async () => {
    expect(await asked('{ mirror { families { versions { id usedBy { name } } } } }')).toBe(true);
    expect(await asked('{ mirror { versions { ...V } } } fragment V on Version { usedBy { name } }')).toBe(true);
    expect(await asked('{ mirror { versions { ... on Version { usedBy { name } } } } }')).toBe(true);
    expect(
      await asked(
        '{ mirror { ...M } } fragment M on Mirror { versions { ...V } } fragment V on Version { usedBy { name } }',
      ),
    ).toBe(true);
  });

  it('says no when the field is not asked', async () => {
    expect(await asked('{ mirror { families { versions { id } } } }')).toBe(false);
    expect(await asked('{ mirror { versions { ...V } } } fragment V on Version { id }')).toBe(false);
  });
});
