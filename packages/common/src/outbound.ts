import dns from 'node:dns';
import net from 'node:net';
import type { ProxyAgent } from 'undici';
import { proxyFor } from './download/proxy.js';

// What the server itself may fetch, and who gets the Hub's token. A URL in fetchToMirror is typed by an operator,
// or pasted from somewhere: without a rule, the server would fetch its own PostgreSQL port, a cloud's metadata
// service (169.254.169.254) or an admin page on the LAN for whoever can ask, and hand HANGAR_HUB_TOKEN to any
// host whose URL merely starts like the Hub's. Air-gapped sites mirror from internal hosts, so those stay
// possible, but only once the operator lists them in HANGAR_FETCH_ALLOW.

/**
 * Whether two URLs have exactly one origin: scheme, host and port as the URL standard normalises them (host
 * lowercased, international names in punycode, a default port dropped; the user:password@ part is no part of
 * it). Only http and https: every other scheme's origin is opaque, and two opaque origins are not the same.
 */
export function sameOrigin(a: string | URL, b: string | URL): boolean {
  const x = parseHttp(a);
  const y = parseHttp(b);
  return x !== null && y !== null && x.origin === y.origin;
}

function parseHttp(u: string | URL): URL | null {
  try {
    const url = typeof u === 'string' ? new URL(u) : u;
    return url.protocol === 'http:' || url.protocol === 'https:' ? url : null;
  } catch {
    return null;
  }
}

/** The Hub's token, for a URL on the Hub's own origin only: never a look-alike, a suffix host or another port. */
export function hubAuthorization(
  url: string,
  hub: { hubUrl: string | null; hubToken?: string },
): Record<string, string> {
  return hub.hubToken && hub.hubUrl && sameOrigin(url, hub.hubUrl) ? { authorization: `Bearer ${hub.hubToken}` } : {};
}

/** The address ranges a public URL never leads to, each in the words a refusal uses. */
const SPECIAL: [address: string, prefix: number, words: string][] = [
  ['0.0.0.0', 8, 'an unspecified ("this network") address'],
  ['10.0.0.0', 8, 'a private address'],
  ['100.64.0.0', 10, 'a shared (carrier-grade NAT) address'],
  ['127.0.0.0', 8, 'a loopback address'],
  ['169.254.0.0', 16, 'a link-local address (where cloud metadata services answer)'],
  ['172.16.0.0', 12, 'a private address'],
  ['192.0.0.0', 24, 'a reserved address'],
  ['192.168.0.0', 16, 'a private address'],
  ['198.18.0.0', 15, 'a reserved (benchmarking) address'],
  ['224.0.0.0', 4, 'a multicast address'],
  ['240.0.0.0', 4, 'a reserved address'],
  ['::', 128, 'an unspecified address'],
  ['::1', 128, 'a loopback address'],
  ['::', 96, 'a reserved (IPv4-compatible) address'],
  ['64:ff9b:1::', 48, 'a local NAT64 address'],
  ['fc00::', 7, 'a unique-local address'],
  ['fe80::', 10, 'a link-local address'],
  ['fec0::', 10, 'a site-local address'],
  ['ff00::', 8, 'a multicast address'],
];
const RANGES = SPECIAL.map(([address, prefix, words]) => {
  const list = new net.BlockList();
  list.addSubnet(address, prefix, net.isIPv6(address) ? 'ipv6' : 'ipv4');
  return { list, words };
});

const family = (address: string) => (net.isIPv6(address) ? 'ipv6' : 'ipv4');

/** How an address is not public (IPv4-mapped IPv6 addresses count as their IPv4 address), or null. */
export function specialAddress(address: string): string | null {
  if (!net.isIP(address)) return null;
  return RANGES.find((r) => r.list.check(address, family(address)))?.words ?? null;
}

/** A URL's host when it is an address (`[::1]` without its brackets), or null for a name. */
function literal(hostname: string): string | null {
  const bare = hostname.replace(/^\[|\]$/g, '');
  return net.isIP(bare) ? bare : null;
}

/** A host name as it is compared: lowercased and punycoded as a URL would, without a final dot. */
function hostKey(name: string): string {
  let host = name;
  try {
    host = new URL(`http://${name}/`).hostname;
  } catch {
    // not a host a URL takes: compared as given
  }
  return host.toLowerCase().replace(/\.$/, '');
}

export type AllowEntry = { kind: 'net'; address: string; prefix: number } | { kind: 'host'; name: string };

/**
 * One entry of HANGAR_FETCH_ALLOW: a network (`10.0.0.0/8`, `fd00::/8`), one address (`127.0.0.1`, `::1`) or a
 * host name (`files.internal`). A string saying what is wrong when it is none of those.
 */
export function parseAllowEntry(text: string): AllowEntry | string {
  const s = text.trim();
  const slash = s.indexOf('/');
  const address = (slash < 0 ? s : s.slice(0, slash)).replace(/^\[|\]$/g, '');
  if (net.isIP(address)) {
    const max = net.isIPv6(address) ? 128 : 32;
    if (slash < 0) return { kind: 'net', address, prefix: max };
    const prefix = s.slice(slash + 1);
    if (!/^\d{1,3}$/.test(prefix) || Number(prefix) > max)
      return `${JSON.stringify(s)}: a network's prefix is 0 to ${max}, such as ${address}/${max === 32 ? 8 : 64}`;
    return { kind: 'net', address, prefix: Number(prefix) };
  }
  if (slash < 0 && /^(?=.{1,253}$)[\p{L}\p{N}_-]+(\.[\p{L}\p{N}_-]+)*\.?$/u.test(s))
    return { kind: 'host', name: hostKey(s) };
  return `${JSON.stringify(s)} is neither a host name, an address nor a network such as 10.0.0.0/8 or fd00::/8`;
}

/** Consulted for each hop of a download before it is sent, and for the addresses its host name resolves to. */
export interface OutboundGuard {
  /** Why this URL may not be fetched, before any byte is sent; null when it may be (as far as it says). */
  refuse(url: URL): string | null;
  /** A lookup for net.connect that hands over only the addresses allowed for this URL. */
  lookup(url: URL): net.LookupFunction | undefined;
}

type Resolve = (hostname: string) => Promise<dns.LookupAddress[]>;

const systemResolve: Resolve = (hostname) => dns.promises.lookup(hostname, { all: true, verbatim: true });

/** An error a refused connection fails with: the reason is the message, the code says it is not worth a retry. */
export class OutboundRefused extends Error {
  readonly code = 'EOUTBOUND';
}

export class OutboundPolicy implements OutboundGuard {
  private readonly names = new Set<string>();
  private readonly nets = new net.BlockList();
  private readonly resolve: Resolve;

  constructor(
    private readonly o: {
      /** HANGAR_FETCH_ALLOW's entries. */
      allow: readonly string[];
      /** The configured Hub, always allowed: the operator chose it. Null when the registry is turned off. */
      hubUrl: string | null;
      /** How host names are resolved (the system's resolver; a test's stand-in). */
      resolve?: Resolve;
    },
  ) {
    this.resolve = o.resolve ?? systemResolve;
    for (const text of o.allow) {
      const e = parseAllowEntry(text);
      if (typeof e === 'string') throw new Error(`HANGAR_FETCH_ALLOW: ${e}`);
      if (e.kind === 'host') this.names.add(e.name);
      else this.nets.addSubnet(e.address, e.prefix, family(e.address));
    }
  }

  /** Listed by name, or the Hub's origin: then any address it resolves to is the operator's choice. */
  private trusted(url: URL) {
    return (this.o.hubUrl !== null && sameOrigin(url, this.o.hubUrl)) || this.names.has(hostKey(url.hostname));
  }

  refuse(url: URL): string | null {
    if (url.protocol !== 'http:' && url.protocol !== 'https:')
      return `${url.protocol} URLs are not fetched: an http:// or https:// URL`;
    if (this.trusted(url)) return null;
    const address = literal(url.hostname);
    return address ? this.refuseAddress(url, address) : null;
  }

  /** Why `url`'s host may not be reached at `address`, or null when it may. */
  refuseAddress(url: URL, address: string): string | null {
    if (this.trusted(url) || this.nets.check(address, family(address))) return null;
    const words = specialAddress(address);
    if (!words) return null;
    const byAddress = literal(url.hostname) !== null;
    const where = byAddress ? url.host : `${url.host} (at ${address})`;
    const example = byAddress ? address : `${url.hostname} or ${address}`;
    return (
      `${where} is ${words}: the server fetches only from public addresses unless HANGAR_FETCH_ALLOW lists the ` +
      `host or its network (such as HANGAR_FETCH_ALLOW=${example}); ask the administrator to add it, or fetch ` +
      'from a public URL'
    );
  }

  lookup(url: URL): net.LookupFunction {
    // Checked on the addresses the connection will really use, resolved once here: a name that resolved to a
    // public address when the fetch was asked for and to 127.0.0.1 now (DNS rebinding) is refused now.
    return (hostname, options, callback) => {
      this.resolve(hostname).then(
        (found) => {
          const wanted = found.filter((a) => !options.family || a.family === options.family);
          // refuseAddress lets every address of a listed name or of the Hub through.
          const allowed = wanted.filter((a) => this.refuseAddress(url, a.address) === null);
          const first = allowed[0];
          if (!first) {
            const why = wanted[0] ? this.refuseAddress(url, wanted[0].address) : `${hostname} has no address`;
            callback(new OutboundRefused(why ?? `${hostname} has no allowed address`), '', 4);
          } else if (options.all) callback(null, allowed);
          else callback(null, first.address, first.family);
        },
        (err: NodeJS.ErrnoException) => callback(err, '', 4),
      );
    };
  }

  /**
   * Why a URL asked for may not be fetched, looking up its name now, so that an operator hears at once rather
   * than from a failed row. A name that does not resolve now is let through: the download says so when it runs.
   */
  async check(text: string): Promise<string | null> {
    const url = parseHttp(text);
    if (!url) return 'an http:// or https:// URL';
    const refused = this.refuse(url);
    if (refused || this.trusted(url) || literal(url.hostname)) return refused;
    // A resolver that does not answer soon must not hold the mutation: the download checks again at connect.
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<dns.LookupAddress[]>((r) => {
      timer = setTimeout(() => r([]), 3000);
    });
    const found = await Promise.race([this.resolve(url.hostname).catch(() => []), late]).finally(() =>
      clearTimeout(timer),
    );
    const reasons = found.map((a) => this.refuseAddress(url, a.address));
    // Refused only when no address is allowed, as the connection would be.
    return found.length > 0 && reasons.every((r) => r !== null) ? (reasons[0] ?? null) : null;
  }
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const CREDENTIALS = ['authorization', 'cookie', 'proxy-authorization'];

// undici is imported at the first fetch through a proxy, not when the server starts (a seventh of a second of
// every start, bench/start.ts): without a proxy, Node's own fetch does the work.
type Undici = typeof import('undici');
let undiciModule: Promise<Undici> | undefined;
function loadUndici(): Promise<Undici> {
  undiciModule ??= import('undici');
  return undiciModule;
}

/**
 * fetch() for the server's calls to the Hub and its CDN, following redirects itself so that each hop is checked
 * by the policy first (its name looked up then: fetch offers no hook at connect time, so here a name that changes
 * its address between the look-up and the connection is not caught, as it is for downloads). Credentials are
 * dropped once a redirect leaves the origin, as fetch itself does.
 *
 * Each hop goes through the proxy the environment names for its URL (HTTPS_PROXY / HTTP_PROXY / NO_PROXY, read
 * by proxyFor, as the downloads do), with undici's ProxyAgent: a CONNECT tunnel, TLS to the Hub inside it, so the
 * proxy never sees the token. The proxy's own address is the operator's choice and is not checked; each hop's
 * host still is, by the addresses this server resolves it to. `ca` adds a certificate authority for the upstream
 * through a proxy (tests); a direct connection trusts NODE_EXTRA_CA_CERTS as fetch does.
 */
export function guardedFetch(policy: OutboundPolicy, fetchImpl?: typeof fetch, o: { ca?: string } = {}): typeof fetch {
  const agents = new Map<string, ProxyAgent>();
  const through = (undici: Undici, proxy: URL) => {
    let agent = agents.get(proxy.href);
    if (!agent) {
      agent = new undici.ProxyAgent({ uri: proxy.href, requestTls: o.ca ? { ca: o.ca } : undefined });
      agents.set(proxy.href, agent);
    }
    return agent;
  };
  return async (input, init) => {
    const request = input instanceof Request ? input : null;
    let url = new URL(request ? request.url : String(input));
    const headers = new Headers(init?.headers ?? request?.headers);
    let method = (init?.method ?? request?.method ?? 'GET').toUpperCase();
    let body = init?.body;
    for (let hop = 0; hop <= 10; hop++) {
      const refused = await policy.check(url.href);
      if (refused) throw new OutboundRefused(hop ? `a redirect led to ${refused}` : refused);
      const hopInit = { ...init, method, headers, body, redirect: 'manual' as const };
      // A fetch handed in (a test's stand-in) is used as it is; the proxy applies to the real one.
      const proxy = fetchImpl ? null : proxyFor(url);
      const undici = proxy ? await loadUndici() : null;
      const res =
        proxy && undici
          ? ((await undici.fetch(url, {
              ...(hopInit as Parameters<Undici['fetch']>[1]),
              dispatcher: through(undici, proxy),
            })) as unknown as Response)
          : await (fetchImpl ?? fetch)(url, hopInit);
      const location = res.headers.get('location');
      if (!REDIRECTS.has(res.status) || !location || init?.redirect === 'manual') return res;
      await res.body?.cancel();
      const next = new URL(location, url);
      if (next.origin !== url.origin) for (const h of CREDENTIALS) headers.delete(h);
      if (res.status === 303 || ((res.status === 301 || res.status === 302) && method === 'POST')) {
        method = method === 'HEAD' ? 'HEAD' : 'GET';
        body = undefined;
      }
      url = next;
    }
    throw new OutboundRefused(`${url.host} redirected more than 10 times`);
  };
}
