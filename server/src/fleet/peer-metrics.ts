import { Counter, type Registry } from 'prom-client';
import type { PeerService } from './peers.service.js';

// /metrics for weights node to node: the bytes each node's agent says it downloaded, by source (the mirror, other
// nodes), and the bytes this process's /mirror sent. Together they show the mirror serving about one copy of a
// model for any number of nodes, and which nodes took theirs from where.

export function registerPeerMetrics(registry: Registry, peers: Pick<PeerService, 'downloadTotals'>) {
  new Counter({
    name: 'hangar_node_download_bytes_total',
    help: "Model bytes each node's agent downloaded since it started, by source (mirror, peer), as it last reported them",
    labelNames: ['node', 'source'],
    registers: [registry],
    // Every worker (HANGAR_WORKERS) reads the same rows: one's figures, not their sum.
    aggregator: 'first',
    // Read from the database at scrape: every server replica reports the same figures, as for the fleet's gauges.
    async collect() {
      const rows = await peers.downloadTotals();
      this.reset();
      for (const r of rows) {
        this.inc({ node: r.node, source: 'mirror' }, r.mirrorBytes);
        this.inc({ node: r.node, source: 'peer' }, r.peerBytes);
      }
    },
  });
  const sent = new Counter({
    name: 'hangar_mirror_sent_bytes_total',
    help: 'Bytes of mirror files this process sent at /mirror (to nodes, and to anyone else fetching them)',
    registers: [registry],
  });
  return { mirrorSent: (bytes: number) => sent.inc(bytes) };
}
