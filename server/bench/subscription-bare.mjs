// The baseline side of bench/subscriptions.ts: graphql-yoga on Hangar's SDL with graphql-ws beside it (Yoga's own
// example), answering `mirrorChanged` from a constant. Plain JavaScript, run by node with nothing in front (no tsx),
// as Hangar's side runs from its build: the two processes differ by what the servers hold, not by a loader.
// Beside the GraphQL port it listens on a control port, where POST /event publishes one event. Prints one JSON
// line, { url, control }, once it answers; stops on SIGTERM.
//
//   node bench/subscription-bare.mjs
import { setMaxListeners } from 'node:events';
import fs from 'node:fs';
import http from 'node:http';
import { useServer } from 'graphql-ws/use/ws';
import { createPubSub, createSchema, createYoga } from 'graphql-yoga';
import { WebSocketServer } from 'ws';

const typeDefs = fs.readFileSync(new URL('../schema.graphql', import.meta.url), 'utf8');
// Hundreds of subscribers on one topic: an EventTarget warns past 10 listeners unless told otherwise.
const target = new EventTarget();
setMaxListeners(0, target);
const pubsub = createPubSub({ eventTarget: target });
const version = {
  id: 'bench/v1',
  model: 'bench',
  version: 'v1',
  state: 'PRESENT',
  bytesDone: 10,
  bytesTotal: 10,
  percent: 100,
  usedBy: [],
};
const yoga = createYoga({
  schema: createSchema({
    typeDefs,
    resolvers: {
      Subscription: {
        mirrorChanged: { subscribe: () => pubsub.subscribe('mirrorVersion'), resolve: () => version },
      },
    },
  }),
  logging: false,
});
const server = http.createServer(yoga);
const wss = new WebSocketServer({ server, path: '/graphql' });
useServer(
  {
    execute: (args) => args.rootValue.execute(args),
    subscribe: (args) => args.rootValue.subscribe(args),
    onSubscribe: async (ctx, _id, params) => {
      const { schema, execute, subscribe, contextFactory, parse, validate } = yoga.getEnveloped({
        ...ctx,
        req: ctx.extra.request,
        socket: ctx.extra.socket,
        params,
      });
      const args = {
        schema,
        operationName: params.operationName,
        document: parse(params.query),
        variableValues: params.variables,
        contextValue: await contextFactory(),
        rootValue: { execute, subscribe },
      };
      const errors = validate(args.schema, args.document);
      return errors.length ? errors : args;
    },
  },
  wss,
);
const listen = (s) => new Promise((r) => s.listen(0, '127.0.0.1', () => r(s.address().port)));
const port = await listen(server);
const control = await listen(
  http.createServer((req, res) => {
    if (req.url === '/event') pubsub.publish('mirrorVersion', 'bench/v1');
    res.end('ok');
  }),
);
console.log(JSON.stringify({ url: `http://127.0.0.1:${port}/graphql`, control: `http://127.0.0.1:${control}` }));
process.on('SIGTERM', () => process.exit(0));
