import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { expect, it } from 'vitest';

// tsc types the CLI's and the agent's documents from schema.graphql but does not validate them: a field the
// schema lacks, or two fields whose types conflict, would type as unknown and fail only at the server. gql.tada's
// check runs GraphQL's validation over every graphql() document in the program, as the editor plugin does.
const server = path.resolve(new URL('..', import.meta.url).pathname);

it('every graphql() document in server/ validates against schema.graphql', () => {
  let printed = '';
  let failed = false;
  try {
    printed = execFileSync('pnpm', ['exec', 'gql.tada', 'check'], { cwd: server, encoding: 'utf8', stdio: 'pipe' });
  } catch (err) {
    failed = true;
    const e = err as { stdout?: string; stderr?: string };
    printed = `${e.stdout ?? ''}${e.stderr ?? ''}`;
  }
  const errors = printed.split('\n').filter((l) => /\terror\t/.test(l));
  expect(errors, printed).toEqual([]);
  expect(failed, printed).toBe(false);
}, 180_000);
