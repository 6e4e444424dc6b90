import http from 'node:http';
import type { Logger } from '@hangar/common/log';
import { sendJson } from '../http/reply.js';
import { credentialsOf, type Route } from '../http/routes.js';
import type { Metrics } from './metrics.js';

// GET /metrics, in Prometheus' text format. On the main port it needs a credential, as every other API does: the
// figures name models, nodes and callers' traffic (Prometheus sends one with `authorization: {credentials: …}` or
// `bearer_token_file`). HANGAR_METRICS_LISTEN moves it to a listener of its own that needs none, for sites whose
// network decides who may scrape; the main port then has no /metrics at all.

async function answer(metrics: Metrics, req: http.IncomingMessage, res: http.ServerResponse) {
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' });
    return res.end(`${req.method} is not served at /metrics: Prometheus scrapes it with GET\n`);
  }
  const { contentType, body } = await metrics.render();
  res.writeHead(200, { 'content-type': contentType, 'cache-control': 'no-store' });
  res.end(req.method === 'HEAD' ? undefined : body);
}

/**
 * The main port's /metrics, a route of the HTTP edge: for a user's API token (or session); 401 in Prometheus'
 * plain words otherwise. With HANGAR_METRICS_LISTEN it is a 404 here that says where it went.
 */
export function metricsRoute(deps: { metrics: Metrics; listenElsewhere: boolean }): Route {
  const route: Route = {
    name: 'metrics',
    match: (path) => path === '/metrics',
    // A scraper sends no CSRF header and only reads.
    credentials: (req) => credentialsOf(req, { csrf: false, method: 'GET' }),
    authorize: (viewer) => {
      if (viewer.kind === 'user' || viewer.kind === 'token') return undefined;
      const why = viewer.kind === 'anonymous' && viewer.reason ? viewer.reason : 'no credential was sent';
      return { status: 401, message: `/metrics needs an API token (Authorization: Bearer hgr_…): ${why}` };
    },
    refuse: (res, refusal) => {
      res.writeHead(refusal.status, { 'content-type': 'text/plain', 'www-authenticate': 'Bearer realm="hangar"' });
      res.end(`${refusal.message}\n`);
    },
    handle: (req, res) => answer(deps.metrics, req, res),
  };
  if (!deps.listenElsewhere) return route;
  return {
    name: 'metrics (moved)',
    match: route.match,
    handle: async (_req, res) =>
      sendJson(res, 404, {
        error: '/metrics is served on HANGAR_METRICS_LISTEN, not on this port',
        code: 'NOT_FOUND',
      }),
  };
}

/** The listener HANGAR_METRICS_LISTEN asks for: /metrics without credentials, and nothing else. */
export async function listenForMetrics(
  metrics: Metrics,
  at: { host: string; port: number },
  log: Logger,
): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (path !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' });
      return res.end('only /metrics is served here\n');
    }
    answer(metrics, req, res).catch((err: unknown) => {
      log.error('metrics: the scrape failed', { error: err });
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
      res.end('the metrics could not be gathered\n');
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(at.port, at.host, () => resolve());
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : at.port;
  const url = `http://${at.host.includes(':') ? `[${at.host}]` : at.host}:${port}/metrics`;
  log.info('metrics are served without credentials', { url });
  return {
    url,
    close: () =>
      new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  };
}
