import { hubLibrary } from './hub-library.js';
import type { RepoFile } from './sets.js';

// The Hugging Face Hub, through its own client, at HANGAR_HUB_URL. Someone else's server on the internet: every
// call has a timeout, and a slow or absent Hub is reported where the explorer is, never anywhere else.

export type HubOptions = {
  hubUrl: string;
  token?: string;
  timeoutMs: number;
  /** The fetch to use: the server's checks each redirect hop against HANGAR_FETCH_ALLOW (guardedFetch). */
  fetch?: typeof fetch;
};

export class HubError extends Error {
  constructor(
    message: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

export type HubModel = {
  id: string;
  downloads: number;
  likes: number;
  lastModified: Date | null;
  gated: boolean;
  hasGguf: boolean;
};
export type HubRepo = { id: string; sha: string; gated: boolean; architecture: string | null; tags: string[] };

export class Hub {
  constructor(private readonly o: HubOptions) {}

  private fetchWithTimeout: typeof fetch = (input, init) =>
    (this.o.fetch ?? fetch)(input, {
      ...init,
      signal: AbortSignal.any([AbortSignal.timeout(this.o.timeoutMs), ...(init?.signal ? [init.signal] : [])]),
    });

  private get common() {
    return {
      hubUrl: this.o.hubUrl,
      fetch: this.fetchWithTimeout,
      ...(this.o.token ? { accessToken: this.o.token } : {}),
    };
  }

  async search(query: string, sort: 'downloads' | 'likes' | 'lastModified', limit: number): Promise<HubModel[]> {
    return wrap(this.o.hubUrl, async () => {
      const { listModels } = await hubLibrary();
      const out: HubModel[] = [];
      for await (const m of listModels({
        ...this.common,
        search: { query },
        sort,
        limit,
        additionalFields: ['tags'],
      })) {
        const tags = (m as { tags?: string[] }).tags ?? [];
        out.push({
          id: m.name,
          downloads: m.downloads ?? 0,
          likes: m.likes ?? 0,
          lastModified: m.updatedAt ? new Date(m.updatedAt) : null,
          gated: Boolean(m.gated),
          hasGguf: tags.includes('gguf'),
        });
        if (out.length >= limit) break;
      }
      return out;
    });
  }

  async repo(id: string, revision?: string): Promise<HubRepo> {
    return wrap(this.o.hubUrl, async () => {
      const { modelInfo } = await hubLibrary();
      const info = await modelInfo({ ...this.common, name: id, revision, additionalFields: ['sha', 'tags', 'config'] });
      const config = (info as { config?: { architectures?: string[]; model_type?: string } }).config;
      return {
        id: info.name,
        sha: (info as { sha?: string }).sha ?? revision ?? 'main',
        gated: Boolean(info.gated),
        architecture: config?.architectures?.[0] ?? config?.model_type ?? null,
        tags: (info as { tags?: string[] }).tags ?? [],
      };
    });
  }

  async files(id: string, revision: string): Promise<RepoFile[]> {
    return wrap(this.o.hubUrl, async () => {
      const { listFiles } = await hubLibrary();
      const out: RepoFile[] = [];
      for await (const f of listFiles({
        ...this.common,
        repo: { type: 'model', name: id },
        revision,
        recursive: true,
      })) {
        if (f.type !== 'file') continue;
        out.push({ path: f.path, size: f.lfs?.size ?? f.size, sha256: f.lfs?.oid ?? null });
        if (out.length > 5000) throw new HubError(`${id} has more than 5000 files: too many to list here`);
      }
      return out;
    });
  }

  get siteUrl() {
    return this.o.hubUrl;
  }

  resolveUrl(id: string, revision: string, path: string) {
    return `${this.o.hubUrl}/${id}/resolve/${encodeURIComponent(revision)}/${path.split('/').map(encodeURIComponent).join('/')}`;
  }

  authHeaders(): Record<string, string> {
    return this.o.token ? { authorization: `Bearer ${this.o.token}` } : {};
  }

  /** The model card (README.md), or null when the repository has none. */
  async readme(id: string, revision: string): Promise<string | null> {
    const res = await this.fetchWithTimeout(this.resolveUrl(id, revision, 'README.md'), {
      headers: this.authHeaders(),
    }).catch(() => null);
    if (!res?.ok) return null;
    return (await readCapped(res, 512 * 1024)).text;
  }

  /** The repository's config.json (what vLLM reads), or null when it has none or it is not JSON. */
  async config(id: string, revision: string): Promise<Record<string, unknown> | null> {
    const res = await this.fetchWithTimeout(this.resolveUrl(id, revision, 'config.json'), {
      headers: this.authHeaders(),
    }).catch(() => null);
    if (!res?.ok) return null;
    // A config is a few KiB; one far larger is not a config to trust, and is not read to its end to find out.
    const { text, cut } = await readCapped(res, 1024 * 1024);
    if (cut) return null;
    try {
      const parsed: unknown = JSON.parse(text);
      return typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)
        ? (parsed as Record<string, unknown>)
        : null;
    } catch {
      return null;
    }
  }

  /** Whether this caller may download the repository's files: gated repositories need a token with access. */
  async canDownload(id: string, revision: string, path: string): Promise<{ ok: boolean; reason: string | null }> {
    const res = await this.fetchWithTimeout(this.resolveUrl(id, revision, path), {
      method: 'HEAD',
      headers: this.authHeaders(),
      redirect: 'follow',
    }).catch((e: Error) => e);
    if (res instanceof Error) return { ok: false, reason: `the registry did not answer: ${res.message}` };
    if (res.status === 401 || res.status === 403) {
      return {
        ok: false,
        reason: this.o.token
          ? `gated: the token in HANGAR_HUB_TOKEN has no access to ${id}; request access on the registry's page`
          : `gated: ${id} needs an access token with access (HANGAR_HUB_TOKEN)`,
      };
    }
    return { ok: res.ok, reason: res.ok ? null : `the registry answered HTTP ${res.status}` };
  }
}

/**
 * At most `max` bytes of a body, as text, and whether there was more: the rest is never read (a repository can hold
 * a "README.md" of gigabytes, and reading it whole to cut it would hold it all in memory first).
 */
async function readCapped(res: Response, max: number): Promise<{ text: string; cut: boolean }> {
  if (!res.body) return { text: '', cut: false };
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  let cut = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (size + value.byteLength > max) {
      chunks.push(value.subarray(0, max - size));
      cut = true;
      await reader.cancel().catch(() => {});
      break;
    }
    chunks.push(value);
    size += value.byteLength;
  }
  // A character cut in two at the limit is decoded as U+FFFD, not an error.
  return { text: Buffer.concat(chunks).toString('utf8'), cut };
}

async function wrap<T>(hubUrl: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof HubError) throw err;
    const e = err as Error & { statusCode?: number };
    if (e.name === 'TimeoutError' || e.name === 'AbortError') throw new HubError('the registry did not answer in time');
    if (e.statusCode === 404) throw new HubError('no such repository on the registry', 404);
    if (e.statusCode === 401 || e.statusCode === 403)
      throw new HubError('the registry refused: a private or gated repository needs HANGAR_HUB_TOKEN', e.statusCode);
    if (e.statusCode) {
      // The Hub's own words, without the request URL it appends (long, and no use to an operator).
      const said = e.message
        .split(/\.?\s+URL:/)[0]
        ?.trim()
        .slice(0, 200);
      throw new HubError(`the registry answered HTTP ${e.statusCode}${said ? `: ${said}` : ''}`, e.statusCode);
    }
    // fetch's own message is only "fetch failed": the reason is its cause's (ENOTFOUND, ECONNREFUSED, "bad port").
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    throw new HubError(unreachable(hubUrl, cause?.code ?? cause?.message ?? e.message));
  }
}

/**
 * Offline, "could not be reached: ENOTFOUND" alone leaves an operator guessing which server and which setting: the
 * message names the host and HANGAR_HUB_URL, and the two ways on for a site without the internet.
 */
export function unreachable(hubUrl: string, why: string): string {
  let host = hubUrl;
  try {
    host = new URL(hubUrl).host;
  } catch {}
  return `the registry at ${host} (HANGAR_HUB_URL=${hubUrl}) could not be reached: ${why}. Without the internet, point HANGAR_HUB_URL at a mirror of the Hub this server can reach, or set HANGAR_HUB_URL=off to turn the registry explorer off (the mirror, serving and training work without it)`;
}
