import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry, type Registry } from 'prom-client';

// /metrics with HANGAR_WORKERS above 1. A scrape reaches one worker (the kernel's connection went to it), but
// every worker counts its own requests: that worker's figures alone would be a half (a third…) of the server's,
// and would jump from one worker's to another's between scrapes. So the worker scraped asks the primary, the
// primary asks every other worker for its figures (as prom-client's JSON), and the worker scraped adds them to
// its own, metric by metric as each declares (prom-client's `aggregator`): counters and histograms summed, the
// figures every worker reads alike from the database taken once ('first'), the process's own as prom-client
// says (CPU and memory summed, the event loop's lag averaged). A worker that does not answer within
// ANSWER_MS (it is dying) is left out of that scrape: its counters drop until it is back, which Prometheus reads
// as a counter reset, as it does when a server restarts.

const GATHER = 'hangar:metrics-gather';
const ASK = 'hangar:metrics-ask';
const ANSWER = 'hangar:metrics-answer';
const GATHERED = 'hangar:metrics-gathered';

/** How long the primary waits for each worker's figures before it answers with those it has. */
const ANSWER_MS = 3000;

type Figures = object[];
type Message = { hangar?: string; id?: number; figures?: Figures[] | Figures };

/** In a worker: answers the primary's requests for this worker's figures, and takes the others' it gathered. */
export function answerScrapes(registry: Registry): { render(): Promise<string> } {
  let next = 0;
  const waiting = new Map<number, (figures: Figures[]) => void>();
  process.on('message', (m: Message) => {
    if (m?.hangar === ASK && typeof m.id === 'number') {
      const id = m.id;
      registry.getMetricsAsJSON().then(
        (figures) => process.send?.({ hangar: ANSWER, id, figures }),
        () => process.send?.({ hangar: ANSWER, id, figures: [] }),
      );
    } else if (m?.hangar === GATHERED && typeof m.id === 'number') {
      waiting.get(m.id)?.((m.figures as Figures[] | undefined) ?? []);
      waiting.delete(m.id);
    }
  });
  return {
    async render() {
      const id = next++;
      const others = new Promise<Figures[]>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(id);
          reject(new Error('the primary process did not send the other workers’ figures (HANGAR_WORKERS)'));
        }, ANSWER_MS * 2);
        waiting.set(id, (figures) => {
          clearTimeout(timer);
          resolve(figures);
        });
        process.send?.({ hangar: GATHER, id });
      });
      const [own, rest] = await Promise.all([registry.getMetricsAsJSON(), others]);
      return AggregatorRegistry.aggregate([own, ...rest]).metrics();
    },
  };
}

/** In the primary: gathers every other worker's figures for the worker that was scraped. */
export function relayScrapes(): void {
  let next = 0;
  const gathering = new Map<number, { from: Worker; id: number; left: Set<number>; figures: Figures[] }>();
  const finish = (key: number) => {
    const g = gathering.get(key);
    if (!g) return;
    gathering.delete(key);
    if (g.from.isConnected()) g.from.send({ hangar: GATHERED, id: g.id, figures: g.figures });
  };
  cluster.on('message', (worker: Worker, m: Message) => {
    if (m?.hangar === GATHER && typeof m.id === 'number') {
      const key = next++;
      const others = Object.values(cluster.workers ?? {}).filter(
        (w): w is Worker => w !== undefined && w !== worker && w.isConnected(),
      );
      gathering.set(key, { from: worker, id: m.id, left: new Set(others.map((w) => w.id)), figures: [] });
      for (const w of others) w.send({ hangar: ASK, id: key });
      if (!others.length) finish(key);
      else setTimeout(() => finish(key), ANSWER_MS).unref();
    } else if (m?.hangar === ANSWER && typeof m.id === 'number') {
      const g = gathering.get(m.id);
      if (!g?.left.delete(worker.id)) return;
      g.figures.push((m.figures as Figures | undefined) ?? []);
      if (!g.left.size) finish(m.id);
    }
  });
}
