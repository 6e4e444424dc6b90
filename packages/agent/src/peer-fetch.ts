import { graphql } from '@hangar/common/client/graphql';
import type { Logger } from '@hangar/common/log';
import { sleep } from '@hangar/common/retry';
import { ControlPlaneError, graphqlRequest, refusedIfError } from './control-plane.js';
import type { ModelCache, PeerSourcing } from './model-cache.js';

// The agent's side of weights node to node, towards the control plane: where to fetch a file from (peerSources,
// asked by the model cache before the mirror), and what this node holds, fetches and has downloaded by source
// (reportNodeFiles, after each heartbeat), whose answer is this node's id and the key the peer server checks
// tickets with. Also the rate limit the tests and the benchmark give a node's link (HANGAR_AGENT_TRANSFER_RATE).

const Agent_PeerSourcesMutation = graphql(`
  mutation Agent_PeerSources($sha256: String!, $bytes: Bytes!, $exclude: [ID!]) {
    peerSources(sha256: $sha256, bytes: $bytes, exclude: $exclude) {
      __typename
      ... on Error { message }
      ... on PeerSources { you fromMirror sources { nodeId node url ticket held } }
    }
  }
`);

const Agent_ReportNodeFilesMutation = graphql(`
  mutation Agent_ReportNodeFiles($input: NodeFilesInput!) {
    reportNodeFiles(input: $input) {
      __typename
      ... on Error { message }
      ... on NodeFilesReport { nodeId peerKey }
    }
  }
`);

export type PeerLinkOptions = { url: string; token: string; cache: () => ModelCache; log: Logger };

/** Bytes this node downloaded since it started, by source. */
export type DownloadCounts = { mirror: number; peer: number };

export class PeerLink implements PeerSourcing {
  readonly counts: DownloadCounts = { mirror: 0, peer: 0 };
  private me: { nodeId: string; key: string } | null = null;
  /** Where other nodes reach this node's peer server (http://host:port), once it listens. */
  url: string | null = null;

  constructor(private readonly o: PeerLinkOptions) {}

  /** This node's id and ticket key, once the control plane has answered a report. */
  identity = () => this.me;

  counted = (source: 'mirror' | 'peer', bytes: number) => {
    this.counts[source] += bytes;
  };

  async sources(sha256: string, bytes: number, exclude: string[]) {
    try {
      const data = await this.ask(sha256, bytes, exclude);
      refusedIfError(data.peerSources, 'peerSources');
      const p = data.peerSources;
      if (p.__typename !== 'PeerSources') return null;
      return { fromMirror: p.fromMirror, sources: p.sources.map((s) => ({ ...s, nodeId: String(s.nodeId) })) };
    } catch (err) {
      // The control plane away, or one from before peers: the mirror, as before.
      this.o.log.warn('could not ask the control plane which nodes hold a file; fetching it from the mirror', {
        sha256,
        error: (err as Error).message,
      });
      return null;
    }
  }

  /**
   * peerSources, asked again a few times (0.5, 1, 2 s) when the control plane did not answer: a busy moment of its
   * must not send every node to the mirror at once.
   */
  private async ask(sha256: string, bytes: number, exclude: string[]) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await graphqlRequest(this.o.url, this.o.token, Agent_PeerSourcesMutation, { sha256, bytes, exclude });
      } catch (err) {
        if (attempt >= 3 || !(err instanceof ControlPlaneError) || err.kind !== 'unreachable') throw err;
        await sleep(500 * 2 ** attempt);
      }
    }
  }

  /** What this node holds and fetches, and its byte counts; keeps the id and key the answer carries. */
  async report(): Promise<void> {
    const cache = this.o.cache();
    const data = await graphqlRequest(this.o.url, this.o.token, Agent_ReportNodeFilesMutation, {
      input: {
        url: this.url,
        held: await cache.heldFiles(),
        fetching: cache.fetchingFiles(),
        mirrorBytes: this.counts.mirror,
        peerBytes: this.counts.peer,
      },
    });
    refusedIfError(data.reportNodeFiles, 'reportNodeFiles');
    const r = data.reportNodeFiles;
    if (r.__typename === 'NodeFilesReport') this.me = { nodeId: String(r.nodeId), key: r.peerKey };
  }
}

/** A token bucket every byte moved one way takes from: a node's link, for tests and the benchmark. */
export class TransferRate {
  private tokens: number;
  private at = Date.now();

  constructor(private readonly bytesPerSecond: number) {
    this.tokens = this.burst();
  }

  /** A tenth of a second's worth, at least 16 KiB: small enough that the limit holds over short windows. */
  private burst() {
    return Math.max(16 << 10, this.bytesPerSecond / 10);
  }

  slice() {
    return Math.max(16 << 10, Math.min(256 << 10, Math.floor(this.bytesPerSecond / 20)));
  }

  async take(bytes: number, signal?: AbortSignal) {
    for (;;) {
      const now = Date.now();
      this.tokens = Math.min(this.burst(), this.tokens + ((now - this.at) / 1000) * this.bytesPerSecond);
      this.at = now;
      if (this.tokens >= bytes || this.tokens >= this.burst()) {
        this.tokens -= bytes;
        return;
      }
      await sleep(Math.ceil(((bytes - this.tokens) / this.bytesPerSecond) * 1000), signal);
    }
  }
}
