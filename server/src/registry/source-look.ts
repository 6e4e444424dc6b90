import { guardedFetch, OutboundPolicy } from '@hangar/common/outbound';
import type { Config } from '../config.js';
import type { FleetService } from '../fleet/fleet.service.js';
import type { SourceCheck } from '../mirror/mirror.service.js';
import { AnswerCache } from './answer-cache.js';
import { HeaderReader } from './look.js';

// GGUF headers read over the network, for the registry explorer and for the look before a fetch by URL (which
// works with the registry off). Its own part, built before the mirror and the registry: the mirror is given its
// lookAtSources, the registry reads through it, and neither needs the other to exist first (the mirror ↔ registry
// cycle a setter used to hide).

export type SourceLookDeps = {
  config: Pick<Config, 'hubUrl' | 'hubToken' | 'hubTimeoutMs' | 'llamaCppBuild' | 'fetchAllow'>;
  fleet: Pick<FleetService, 'llamaCppBuild'>;
};

export class SourceLook {
  /**
   * The server's outbound rules (HANGAR_FETCH_ALLOW), each redirect hop checked as a download's are: the Hub's
   * redirects (to its CDN) are followed only into networks it admits. The registry's requests to the Hub use it too.
   */
  readonly fetch: typeof fetch;
  readonly headers: HeaderReader;
  /** Header reads by URL, so the explorer's judging and the fetch that follows read a file's header once. */
  private readonly reads = new AnswerCache();

  constructor(deps: SourceLookDeps) {
    this.fetch = guardedFetch(new OutboundPolicy({ allow: deps.config.fetchAllow, hubUrl: deps.config.hubUrl }));
    this.headers = new HeaderReader({ config: deps.config, fleet: deps.fleet, fetch: this.fetch });
  }

  /** A file's header, read once a minute at most; `headers` are the Hub's own (its token) when it is the Hub's. */
  read(url: string, headers?: Record<string, string>) {
    return this.reads.get(`gguf:${url}`, () => this.headers.read(url, headers));
  }

  /**
   * The look before a fetch by URL (the mirror's lookBeforeFetch): each file's header, judged against the
   * llama.cpp the nodes run. Four at a time: a fifteen-file version should not open fifteen connections at once.
   */
  async lookAtSources(files: { url: string; file: string }[]): Promise<SourceCheck[]> {
    if (!files.length) return [];
    const build = await this.headers.build();
    return mapLimit(files, 4, (f) => this.headers.look(f.file, build, () => this.read(f.url)));
  }
}

/** Runs `fn` over `items`, at most `limit` at a time, answers in the items' order. */
export async function mapLimit<T, R>(items: T[], limit: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i] as T);
      }
    }),
  );
  return out;
}
