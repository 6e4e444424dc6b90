// Temporary experiment (not to commit): patches applied to Hangar's process before the bench runs.
import http from 'node:http';
import { syncBuiltinESMExports } from 'node:module';
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const which = (process.env.EXP ?? '').split(',');
if (which.includes('noflush')) {
  http.ServerResponse.prototype.flushHeaders = function () {};
}
if (which.includes('pipe')) {
  const sp = require('node:stream/promises');
  sp.pipeline = (src: NodeJS.ReadableStream & { once: Function }, dst: NodeJS.WritableStream & { once: Function }) =>
    new Promise<void>((resolve, reject) => {
      src.once('error', reject);
      dst.once('error', reject);
      (dst as unknown as { once: Function }).once('finish', () => resolve());
      src.pipe(dst);
    });
  syncBuiltinESMExports();
}
await import('./gateway.ts');
