import type dns from 'node:dns';
import http from 'node:http';
import type net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { type HttpGetError, httpGet } from './download/http-get.js';
import {
  guardedFetch,
  hubAuthorization,
  OutboundPolicy,
  parseAllowEntry,
  sameOrigin,
  specialAddress,
} from './outbound.js';

// Who gets the Hub's token, and which hosts the server fetches from: the URL tricks one at a time, then the
// download client on real sockets with a policy in force.

describe("the Hub's token", () => {
  const token = 'hf_secret';
  const to = (url: string, hubUrl = 'https://huggingface.co') => hubAuthorization(url, { hubUrl, hubToken: token });
  const sent = { authorization: `Bearer ${token}` };

  it('goes to the Hub itself, whatever the case of its name or an explicit default port', () => {
    expect(to('https://huggingface.co/acme/m/resolve/main/w.gguf')).toEqual(sent);
    expect(to('https://HUGGINGFACE.CO/acme/m/resolve/main/w.gguf')).toEqual(sent);
    expect(to('https://huggingface.co:443/acme/m/resolve/main/w.gguf')).toEqual(sent);
    expect(to('http://127.0.0.1:4900/a/b/resolve/main/f', 'http://127.0.0.1:4900')).toEqual(sent);
  });

  it('never goes to a host whose URL only starts like the Hub', () => {
    // user:password@ before the real host: the old prefix test sent the token to 127.0.0.1:4900.
    expect(to('http://127.0.0.1:49@127.0.0.1:4900/a/b/resolve/main/f', 'http://127.0.0.1:49')).toEqual({});
    expect(to('http://hub@evil.example/a/b/resolve/main/f', 'http://hub')).toEqual({});
    // a longer host name that begins with the Hub's
    expect(to('https://huggingface.co.attacker/acme/m/resolve/main/w.gguf')).toEqual({});
    expect(to('https://huggingface.company/acme/m/resolve/main/w.gguf')).toEqual({});
    // another port or another scheme on the same host
    expect(to('https://huggingface.co:8443/acme/m/resolve/main/w.gguf')).toEqual({});
    expect(to('http://huggingface.co/acme/m/resolve/main/w.gguf')).toEqual({});
    expect(to('http://127.0.0.1:49000/a/b/resolve/main/f', 'http://127.0.0.1:49')).toEqual({});
  });

  it('never goes to a look-alike name: punycode, a Cyrillic а, a trailing dot', () => {
    expect(to('https://xn--huggingfce-6qi.co/acme/m/resolve/main/w.gguf')).toEqual({});
    expect(to('https://huggingf\u0430ce.co/acme/m/resolve/main/w.gguf')).toEqual({}); // а is U+0430
    // A final dot names the same DNS host, but it is another origin to the URL standard (and to the Hub's TLS
    // certificate checks): sending the token there is not needed, so it is not sent.
    expect(to('https://huggingface.co./acme/m/resolve/main/w.gguf')).toEqual({});
  });

  it('is sent by no rule when there is no token, and only between http(s) origins', () => {
    expect(hubAuthorization('https://huggingface.co/x', { hubUrl: 'https://huggingface.co' })).toEqual({});
    expect(sameOrigin('file:///etc/passwd', 'file:///etc/passwd')).toBe(false);
    expect(sameOrigin('not a url', 'https://huggingface.co')).toBe(false);
  });
});

describe('addresses that are not public', () => {
  it.each([
    ['127.0.0.1', 'a loopback address'],
    ['127.8.9.10', 'a loopback address'],
    ['::1', 'a loopback address'],
    ['::ffff:127.0.0.1', 'a loopback address'],
    ['10.1.2.3', 'a private address'],
    ['172.20.0.1', 'a private address'],
    ['192.168.1.1', 'a private address'],
    ['169.254.169.254', 'a link-local address (where cloud metadata services answer)'],
    ['fe80::1', 'a link-local address'],
    ['fd12:3456::1', 'a unique-local address'],
    ['100.64.0.1', 'a shared (carrier-grade NAT) address'],
    ['0.0.0.0', 'an unspecified ("this network") address'],
    ['::', 'an unspecified address'],
  ])('%s is %s', (address, words) => {
    expect(specialAddress(address)).toBe(words);
  });

  it.each(['8.8.8.8', '172.32.0.1', '2606:4700::1111', '::ffff:8.8.8.8'])('%s is public', (address) => {
    expect(specialAddress(address)).toBeNull();
  });
});

describe('HANGAR_FETCH_ALLOW entries', () => {
  it('takes host names, addresses and networks of either family', () => {
    expect(parseAllowEntry('files.internal')).toEqual({ kind: 'host', name: 'files.internal' });
    expect(parseAllowEntry('Files.Internal.')).toEqual({ kind: 'host', name: 'files.internal' });
    expect(parseAllowEntry('127.0.0.1')).toEqual({ kind: 'net', address: '127.0.0.1', prefix: 32 });
    expect(parseAllowEntry('10.0.0.0/8')).toEqual({ kind: 'net', address: '10.0.0.0', prefix: 8 });
    expect(parseAllowEntry('fd00::/8')).toEqual({ kind: 'net', address: 'fd00::', prefix: 8 });
    expect(parseAllowEntry('[::1]')).toEqual({ kind: 'net', address: '::1', prefix: 128 });
  });

  it('refuses what is none of those, saying what is accepted', () => {
    expect(parseAllowEntry('10.0.0.0/33')).toMatch(/prefix is 0 to 32/);
    expect(parseAllowEntry('http://files.internal/')).toMatch(/neither a host name, an address nor a network/);
    expect(parseAllowEntry('files internal')).toMatch(/neither/);
  });
});

/** A resolver that answers from a table, as DNS would for names this machine cannot look up. */
function table(entries: Record<string, string[]>) {
  return async (name: string): Promise<dns.LookupAddress[]> => {
    const found = entries[name];
    if (!found) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${name}`), { code: 'ENOTFOUND' });
    return found.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
  };
}

describe('the policy, before anything is sent', () => {
  const policy = (allow: string[] = [], resolve = table({})) =>
    new OutboundPolicy({ allow, hubUrl: 'http://127.0.0.1:4900', resolve });
  const refuse = (p: OutboundPolicy, url: string) => p.refuse(new URL(url));

  it('refuses loopback and private addresses by default, naming the setting', () => {
    const p = policy();
    expect(refuse(p, 'http://127.0.0.1:5432/')).toMatch(
      /^127\.0\.0\.1:5432 is a loopback address: the server fetches only from public addresses unless HANGAR_FETCH_ALLOW lists/,
    );
    expect(refuse(p, 'http://169.254.169.254/latest/meta-data/')).toMatch(/link-local/);
    expect(refuse(p, 'http://[::1]:8080/')).toMatch(/loopback/);
    // The URL standard's other spellings of 127.0.0.1 are the same address once parsed.
    expect(refuse(p, 'http://0x7f.1/')).toMatch(/loopback/);
    expect(refuse(p, 'http://2130706433/')).toMatch(/loopback/);
    expect(refuse(p, 'http://[::ffff:127.0.0.1]/')).toMatch(/loopback/);
    expect(refuse(p, 'https://203.0.113.9/')).toBeNull(); // public (documentation range, not special here)
  });

  it("lets the configured Hub's origin through, but not another port on its host", () => {
    const p = policy();
    expect(refuse(p, 'http://127.0.0.1:4900/a/b/resolve/main/f')).toBeNull();
    expect(refuse(p, 'http://127.0.0.1:4901/')).toMatch(/loopback/);
    expect(refuse(p, 'http://127.0.0.1:4900@127.0.0.1:5432/')).toMatch(/127\.0\.0\.1:5432 is a loopback/);
  });

  it('lets listed addresses, networks and names through', () => {
    expect(refuse(policy(['127.0.0.1']), 'http://127.0.0.1:8080/')).toBeNull();
    expect(refuse(policy(['10.0.0.0/8']), 'http://10.20.30.40/')).toBeNull();
    expect(refuse(policy(['10.0.0.0/8']), 'http://192.168.0.1/')).toMatch(/private/);
    expect(refuse(policy(['fd00::/8']), 'http://[fd00::5]/')).toBeNull();
  });

  it('looks a name up when the fetch is asked for: a name for a private address is refused', async () => {
    const resolve = table({
      'internal.example': ['10.9.8.7'],
      'public.example': ['203.0.113.9'],
      'both.example': ['203.0.113.9', '127.0.0.1'],
    });
    expect(await policy([], resolve).check('http://internal.example/w.gguf')).toMatch(
      /^internal\.example \(at 10\.9\.8\.7\) is a private address/,
    );
    expect(await policy(['internal.example'], resolve).check('http://internal.example/w.gguf')).toBeNull();
    expect(await policy(['10.0.0.0/8'], resolve).check('http://internal.example/w.gguf')).toBeNull();
    expect(await policy([], resolve).check('http://public.example/w.gguf')).toBeNull();
    // Some address is allowed: the connection will use only that one.
    expect(await policy([], resolve).check('http://both.example/w.gguf')).toBeNull();
    // A name that does not resolve now is left to the download, which says why when it runs.
    expect(await policy([], resolve).check('http://nowhere.example/w.gguf')).toBeNull();
    expect(await policy([], resolve).check('ftp://public.example/w.gguf')).toMatch(/http/);
  });
});

describe('the download client with a policy', () => {
  const closers: (() => void)[] = [];
  afterEach(() => {
    for (const c of closers.splice(0)) c();
  });

  /** A real server on loopback that records each request it gets. */
  async function server(answer: (req: http.IncomingMessage, res: http.ServerResponse) => void) {
    const seen: { path: string; authorization?: string }[] = [];
    const s = http.createServer((req, res) => {
      seen.push({ path: req.url ?? '', authorization: req.headers.authorization });
      answer(req, res);
    });
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    closers.push(() => {
      s.closeAllConnections();
      s.close();
    });
    return { port: (s.address() as net.AddressInfo).port, seen };
  }
  const file = (_: http.IncomingMessage, res: http.ServerResponse) => res.end('weights');
  const get = (url: string, p: OutboundPolicy, headers: Record<string, string> = {}) =>
    httpGet(url, { headers, signal: new AbortController().signal, guard: p });
  const refusal = (p: Promise<unknown>) =>
    p.then(
      () => null,
      (e: HttpGetError) => ({ code: e.code, message: e.message }),
    );

  it('refuses loopback by default without sending a byte, and fetches it once listed', async () => {
    const up = await server(file);
    const url = `http://127.0.0.1:${up.port}/w.gguf`;
    const hubUrl = 'https://huggingface.co';
    const refused = await refusal(get(url, new OutboundPolicy({ allow: [], hubUrl })));
    expect(refused).toMatchObject({ code: 'EOUTBOUND' });
    expect(refused?.message).toMatch(/is a loopback address.*HANGAR_FETCH_ALLOW/);
    expect(up.seen).toEqual([]);

    const res = await get(url, new OutboundPolicy({ allow: ['127.0.0.1'], hubUrl }));
    expect(res.status).toBe(200);
    res.cancel();
    expect(up.seen).toHaveLength(1);
  });

  it('refuses a name that resolves to a private address at connect time (DNS rebinding)', async () => {
    const up = await server(file);
    // The name resolved to a public address when the fetch was asked for, and to loopback when it connects.
    let answers = 0;
    const rebinding = async (): Promise<dns.LookupAddress[]> => [
      { address: answers++ === 0 ? '203.0.113.9' : '127.0.0.1', family: 4 },
    ];
    const p = new OutboundPolicy({ allow: [], hubUrl: 'https://huggingface.co', resolve: rebinding });
    const url = `http://rebind.example:${up.port}/w.gguf`;
    expect(await p.check(url)).toBeNull();
    const refused = await refusal(get(url, p));
    expect(refused).toMatchObject({ code: 'EOUTBOUND' });
    expect(refused?.message).toMatch(/^rebind\.example:\d+ \(at 127\.0\.0\.1\) is a loopback address/);
    expect(up.seen).toEqual([]);

    // Listed, the same name connects to the address it resolves to.
    const listed = new OutboundPolicy({
      allow: ['127.0.0.0/8'],
      hubUrl: 'https://huggingface.co',
      resolve: table({ 'rebind.example': ['127.0.0.1'] }),
    });
    const res = await get(url, listed);
    expect(res.status).toBe(200);
    res.cancel();
    expect(up.seen).toHaveLength(1);
  });

  it('refuses a redirect from an allowed host into loopback, at the hop', async () => {
    const inner = await server(file);
    const outer = await server((_, res) =>
      res.writeHead(302, { location: `http://127.0.0.1:${inner.port}/secret` }).end(),
    );
    // The allowed host is listed by name (and resolves to the stand-in's loopback address); the redirect's
    // target is an address nobody listed.
    const p = new OutboundPolicy({
      allow: ['files.internal'],
      hubUrl: 'https://huggingface.co',
      resolve: table({ 'files.internal': ['127.0.0.1'] }),
    });
    const refused = await refusal(get(`http://files.internal:${outer.port}/w.gguf`, p));
    expect(refused).toMatchObject({ code: 'EOUTBOUND' });
    expect(refused?.message).toMatch(/^a redirect led to 127\.0\.0\.1:\d+ is a loopback address/);
    expect(outer.seen).toHaveLength(1);
    expect(inner.seen).toEqual([]);
  });

  it("keeps the Hub's token to the Hub's origin across a redirect to its CDN", async () => {
    const cdn = await server(file);
    const hub = await server((_, res) => res.writeHead(302, { location: `http://localhost:${cdn.port}/lfs` }).end());
    const hubUrl = `http://127.0.0.1:${hub.port}`;
    const url = `${hubUrl}/acme/m/resolve/main/w.gguf`;
    const p = new OutboundPolicy({ allow: ['localhost'], hubUrl });
    const res = await get(url, p, hubAuthorization(url, { hubUrl, hubToken: 'hf_secret' }));
    expect(res.status).toBe(200);
    res.cancel();
    expect(hub.seen).toEqual([{ path: '/acme/m/resolve/main/w.gguf', authorization: 'Bearer hf_secret' }]);
    expect(cdn.seen).toEqual([{ path: '/lfs', authorization: undefined }]);
  });

  it("checks each hop of the registry's own calls (fetch) too, and drops the token when one leaves the Hub", async () => {
    const cdn = await server(file);
    const hub = await server((_, res) => res.writeHead(302, { location: `http://localhost:${cdn.port}/lfs` }).end());
    const hubUrl = `http://127.0.0.1:${hub.port}`;
    const headers = { authorization: 'Bearer hf_secret', range: 'bytes=0-3' };
    const refused = await guardedFetch(new OutboundPolicy({ allow: [], hubUrl }))(`${hubUrl}/a/b/resolve/main/w`, {
      headers,
    }).catch((e: Error) => e.message);
    expect(refused).toMatch(/^a redirect led to localhost:\d+ \(at (127\.0\.0\.1|::1)\) is a loopback address/);
    expect(cdn.seen).toEqual([]);

    const res = await guardedFetch(new OutboundPolicy({ allow: ['localhost'], hubUrl }))(
      `${hubUrl}/a/b/resolve/main/w`,
      { headers },
    );
    expect(await res.text()).toBe('weights');
    expect(hub.seen.map((q) => q.authorization)).toEqual(['Bearer hf_secret', 'Bearer hf_secret']);
    expect(cdn.seen).toEqual([{ path: '/lfs', authorization: undefined }]);
  });
});
