import { AsyncLocalStorage } from 'node:async_hooks';
import pg from 'pg';

/**
 * The SQL statements pg sends on behalf of what runs inside `record` (an in-process request: the server's
 * background loops, started outside it, are not counted). A pool's query is taken once as it is asked (it may
 * wait for a free connection, out of the caller's async context) and the client query it then makes is not taken
 * again; a transaction's client is taken directly. Patches pg's prototypes once per process.
 */
const current = new AsyncLocalStorage<string[]>();
const everywhere = new Set<string[]>();
let installed = false;

function textOf(args: unknown[]): string {
  const q = args[0] as string | { text?: string } | undefined;
  return (typeof q === 'string' ? q : (q?.text ?? '')).replace(/\s+/g, ' ').trim();
}

function install() {
  if (installed) return;
  installed = true;
  const clientQuery = pg.Client.prototype.query as (...a: unknown[]) => unknown;
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    current.getStore()?.push(textOf(args));
    if (everywhere.size) for (const list of everywhere) list.push(textOf(args));
    return clientQuery.apply(this, args);
  } as typeof pg.Client.prototype.query;
  const poolQuery = pg.Pool.prototype.query as (...a: unknown[]) => unknown;
  pg.Pool.prototype.query = function (this: pg.Pool, ...args: unknown[]) {
    current.getStore()?.push(textOf(args));
    return current.exit(() => poolQuery.apply(this, args));
  } as typeof pg.Pool.prototype.query;
}

export async function recordSql<T>(run: () => Promise<T>): Promise<{ result: T; statements: string[] }> {
  install();
  const statements: string[] = [];
  const result = await current.run(statements, run);
  return { result, statements };
}

/**
 * Every statement any pg client of this process sends while `run` runs, whatever async context it comes from: a
 * subscription's resolvers run in their connection's context, not the test's. The server's background loops send
 * theirs meanwhile, so a test picks out the statements it is about.
 */
export async function recordAllSql<T>(run: () => Promise<T>): Promise<{ result: T; statements: string[] }> {
  install();
  const statements: string[] = [];
  everywhere.add(statements);
  try {
    return { result: await run(), statements };
  } finally {
    everywhere.delete(statements);
  }
}
