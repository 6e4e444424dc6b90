import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { useGraphQlJit } from '@envelop/graphql-jit';
import { createSchema, createYoga } from 'graphql-yoga';
import { benchToken } from './api-token.js';

// One side of bench/auth.ts, in a process of its own so the sides do not share a heap, an event loop or a JIT:
// `bare` is graphql-yoga on Hangar's SDL answering the viewer from a constant (no auth work at all), with
// graphql-jit as Hangar runs its queries, so the ratio is Hangar's own layers and not the executor; `hangar
// <src>` is the Hangar whose sources are in <src> (this tree's server/src, or an older copy to compare with).
// Prints one JSON line, { url, token }, once it answers; stops on SIGTERM.

const [mode, src] = process.argv.slice(2);

if (mode === 'bare') {
  const typeDefs = await fs.readFile(new URL('../schema.graphql', import.meta.url), 'utf8');
  const user = { id: 'u1', email: 'admin@hangar.local', name: 'Administrator', role: 'ADMIN' };
  const yoga = createYoga({
    schema: createSchema({ typeDefs, resolvers: { Query: { viewer: () => ({ role: 'VIEWER', user }) } } }),
    plugins: [useGraphQlJit()],
    logging: false,
  });
  const server = http.createServer(yoga);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/graphql`;
  console.log(JSON.stringify({ url, token: 'none' }));
  process.on('SIGTERM', () => server.close(() => process.exit(0)));
} else {
  const from = (file: string) => import(pathToFileURL(path.join(src as string, file)).href);
  const { createApp } = await from('app.ts');
  const { loadConfig } = await from('config.ts');
  const { createLogger } = await import('@hangar/common/log');
  const root = path.join(os.tmpdir(), `hangar-bench-auth-${process.pid}`);
  await fs.mkdir(root, { recursive: true, mode: 0o755 });
  const config = loadConfig({
    HANGAR_DATA_DIR: root,
    PORT: '0',
    HANGAR_LOG_LEVEL: 'warn',
    HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
  });
  const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
  const base = await app.start();
  const token = await benchToken(base);
  console.log(JSON.stringify({ url: `${base}/graphql`, token }));
  process.on('SIGTERM', () => {
    void (async () => {
      await app.stop();
      await fs.rm(root, { recursive: true, force: true });
      process.exit(0);
    })();
  });
}
