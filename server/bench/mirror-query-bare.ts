import fs from 'node:fs/promises';
import http from 'node:http';
import { useGraphQlJit } from '@envelop/graphql-jit';
import { createSchema, createYoga } from 'graphql-yoga';

// The baseline side of bench/mirror-query.ts, in a process of its own: graphql-yoga on Hangar's SDL with
// graphql-jit, as Hangar runs queries, answering `mirror` with the answer Hangar gave (read from the file named
// by argv[2]), so both sides send the same bytes. No auth, no database, no armor: what is left between the two
// is what Hangar's own layers cost. Prints one JSON line, { url }, once it listens; stops on SIGTERM.

const typeDefs = await fs.readFile(new URL('../schema.graphql', import.meta.url), 'utf8');
const answer = JSON.parse(await fs.readFile(process.argv[2] as string, 'utf8')) as { data: { mirror: unknown } };
const yoga = createYoga({
  schema: createSchema({ typeDefs, resolvers: { Query: { mirror: () => answer.data.mirror } } }),
  plugins: [useGraphQlJit()],
  logging: false,
});
const server = http.createServer(yoga);
await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
console.log(JSON.stringify({ url: `http://127.0.0.1:${(server.address() as { port: number }).port}/graphql` }));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
