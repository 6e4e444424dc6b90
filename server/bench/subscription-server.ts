import { setMaxListeners } from 'node:events';
import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import type { ExecutionArgs } from 'graphql';
import { useServer } from 'graphql-ws/use/ws';
import { createPubSub, createSchema, createYoga } from 'graphql-yoga';
import { WebSocketServer } from 'ws';
import { benchToken } from './api-token.js';

// One side of bench/subscriptions.ts, in a process of its own so the sides share no heap, event loop or JIT.
// `bare` is graphql-yoga on Hangar's SDL with graphql-ws beside it (Yoga's own example), answering
// `mirrorChanged` from a constant; `hangar <src>` is the Hangar whose sources are in <src>, a mirror version in
// its database, the event sent through PostgreSQL as the mirror sends it. Each side also listens on a control
// port: POST /event sends one event, GET /memory says the process's resident memory and the warnings it printed
// (a MaxListenersExceededWarning would be one). Prints one JSON line,
// { url, control, token }, once it answers; stops on SIGTERM.

const [mode, src] = process.argv.slice(2);

type EnvelopedRoot = { execute: (args: ExecutionArgs) => unknown; subscribe: (args: ExecutionArgs) => unknown };
type Control = { event: () => Promise<void> };

const warnings: string[] = [];
process.on('warning', (w) => warnings.push(w.name));

async function control({ event }: Control): Promise<string> {
  const server = http.createServer(async (req, res) => {
    if (req.url === '/event') await event();
    const body = req.url === '/memory' ? JSON.stringify({ rss: process.memoryUsage().rss, warnings }) : 'ok';
    res.writeHead(200, { 'content-length': Buffer.byteLength(body) }).end(body);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

if (mode === 'bare') {
  const typeDefs = await fs.readFile(new URL('../schema.graphql', import.meta.url), 'utf8');
  // Hundreds of subscribers on one topic: an EventTarget warns past 10 listeners unless told otherwise.
  const target = new EventTarget();
  setMaxListeners(0, target);
  const pubsub = createPubSub<{ mirrorVersion: [string] }>({ eventTarget: target });
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
      execute: (args) => (args.rootValue as EnvelopedRoot).execute(args) as never,
      subscribe: (args) => (args.rootValue as EnvelopedRoot).subscribe(args) as never,
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
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/graphql`;
  const ctl = await control({ event: async () => pubsub.publish('mirrorVersion', 'bench/v1') });
  console.log(JSON.stringify({ url, control: ctl, token: 'none' }));
  process.on('SIGTERM', () => process.exit(0));
} else {
  const from = (file: string) => import(pathToFileURL(path.join(src as string, file)).href);
  const { createApp } = await from('app.ts');
  const { loadConfig } = await from('config.ts');
  const { createLogger } = await import('@hangar/common/log');
  const { notify } = await from('pubsub.ts');
  const root = path.join(os.tmpdir(), `hangar-bench-subs-${process.pid}`);
  await fs.mkdir(root, { recursive: true, mode: 0o755 });
  const config = loadConfig({
    HANGAR_DATA_DIR: root,
    PORT: '0',
    HANGAR_LOG_LEVEL: 'warn',
    HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
    // One caller holds every subscriber here; the caps guard against one caller doing that by accident.
    HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER: '5000',
    HANGAR_MAX_CONNECTIONS: '5000',
  });
  const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
  const base = await app.start();
  await app.db.prisma.mirrorFile.create({
    data: {
      model: 'bench',
      version: 'v1',
      file: 'model.gguf',
      sourceUrl: 'https://hub.example/bench/model.gguf',
      state: 'PRESENT',
      bytesDone: 10n,
      bytesTotal: 10n,
    },
  });
  const token = await benchToken(base);
  // Sent as the mirror sends its events: NOTIFY, heard back over LISTEN, then fanned out.
  const ctl = await control({ event: () => notify(app.db.prisma, 'mirrorVersion', 'bench/v1') });
  console.log(JSON.stringify({ url: `${base}/graphql`, control: ctl, token }));
  process.on('SIGTERM', () => {
    void (async () => {
      await app.stop();
      await fs.rm(root, { recursive: true, force: true });
      process.exit(0);
    })();
  });
}
