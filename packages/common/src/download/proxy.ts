import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { getProxyForUrl } from 'proxy-from-env';
import type { OutboundGuard } from '../outbound.js';

// Which proxy a request to a URL goes through: HTTPS_PROXY for https:// URLs, HTTP_PROXY for http:// ones,
// ALL_PROXY for either, none for a host NO_PROXY names. Lower-case names win over upper-case ones, as in curl.
// Sites put their mirrors behind corporate egress, where nothing reaches the Hub but through the proxy.
// Read by proxy-from-env (the rules axios and many CLI tools use), and the one place both the download client
// (httpGet) and the registry's Hub requests (guardedFetch) ask, so both go the same way.
//
// NO_PROXY: comma- or space-separated host names (exact), `.example.com` or `*.example.com` for every host under
// it, `host:port` for one port, `*` for none at all. Read at each request, so a test can set them.
//
// The proxy's own address is not checked against HANGAR_FETCH_ALLOW: the operator configured it, and a
// corporate proxy is usually on a private address. The URL's host still is, by name and by what the server's
// resolver says it resolves to (see throughProxy); what the proxy itself resolves it to cannot be seen from here.

/** The proxy for `url` from the environment, or null to connect directly. */
export function proxyFor(url: URL): URL | null {
  const found = getProxyForUrl(url.href);
  if (!found) return null;
  try {
    return new URL(found);
  } catch {
    return null;
  }
}

/** Proxy-Authorization for a proxy URL that carries user:password@, or none. */
export function proxyAuthorization(proxy: URL): Record<string, string> {
  if (!proxy.username) return {};
  const user = decodeURIComponent(proxy.username);
  const password = decodeURIComponent(proxy.password);
  return { 'proxy-authorization': `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}` };
}

/** Why the guard refuses `url` going by the addresses this server resolves its name to, or null. */
export async function refusedByResolution(url: URL, guard: OutboundGuard): Promise<string | null> {
  const lookup = guard.lookup(url);
  if (!lookup) return null;
  const host = url.hostname.replace(/^\[|\]$/g, '');
  return new Promise((resolve) => {
    lookup(host, { all: true }, (err) => {
      // A name this server cannot resolve is the proxy's to resolve (it often sees a DNS this host does not).
      resolve(err && (err as NodeJS.ErrnoException).code === 'EOUTBOUND' ? err.message : null);
    });
  });
}

export class ProxyError extends Error {
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

/**
 * A tunnel through `proxy` to `url`'s host and port (HTTP CONNECT, made by node:http): the TLS session to the
 * upstream then runs inside it, so the proxy sees the host and port and nothing of the request, its headers
 * (the Hub's token) or the file.
 */
export function tunnel(proxy: URL, url: URL, signal: AbortSignal): Promise<net.Socket> {
  const port = Number(url.port) || (url.protocol === 'https:' ? 443 : 80);
  const target = `${url.hostname}:${port}`;
  return new Promise((resolve, reject) => {
    const req = (proxy.protocol === 'https:' ? https : http).request({
      host: proxy.hostname.replace(/^\[|\]$/g, ''),
      port: Number(proxy.port) || (proxy.protocol === 'https:' ? 443 : 80),
      method: 'CONNECT',
      path: target,
      headers: { host: target, ...proxyAuthorization(proxy) },
      signal,
    });
    req.once('connect', (res, socket) => {
      if (res.statusCode === 200) return resolve(socket);
      socket.destroy();
      const why = res.statusCode === 407 ? ': it wants credentials (user:password@ in HTTPS_PROXY)' : '';
      reject(
        new ProxyError(
          `the proxy ${proxy.host} refused a tunnel to ${target} (HTTP ${res.statusCode}${why})`,
          // A proxy that cannot reach the upstream is an outage of the upstream, retried as one.
          res.statusCode === 502 || res.statusCode === 503 || res.statusCode === 504 ? 'ECONNREFUSED' : 'EPROXY',
        ),
      );
    });
    req.once('error', (err: NodeJS.ErrnoException) => reject(err));
    req.end();
  });
}
