import { csrfHeaders } from '../../graphql/csrf';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { formatBytes, shortSha } from '../../lib/format';

// The pairs a job trains on: uploaded with POST /api/train/data (a file can be far over the GraphQL body limit)
// before the job is submitted, so the operator reads the server's report first; createTrainJob then names them by
// the sha256 the upload answered with.

const LengthStatsFragment = graphql(`
  fragment TrainData_LengthStats on LengthStats {
    min
    max
    mean
    p50
    p95
  }
`);

/**
 * The schema's TrainDataReport, whole: POST /api/train/data answers the object checkTrainData does, as JSON. Never
 * sent: it types the upload's answer from server/schema.graphql, so a field the server renames fails tsc here.
 */
export const TrainData_ReportFragment = graphql(
  `
  fragment TrainData_Report on TrainDataReport {
    pairs
    bytes
    sha256
    ok
    errors {
      line
      message
    }
    errorCount
    duplicates {
      line
      sameAs
    }
    duplicateCount
    collections
    question {
      ...TrainData_LengthStats
    }
    answer {
      ...TrainData_LengthStats
    }
    tokens {
      model
      question {
        ...TrainData_LengthStats
      }
      answer {
        ...TrainData_LengthStats
      }
      pair {
        ...TrainData_LengthStats
      }
      maxLen
      overMaxLen
    }
    tokensNote
  }
`,
  [LengthStatsFragment],
);

export type LengthStats = ResultOf<typeof LengthStatsFragment>;

type WholeReport = ResultOf<typeof TrainData_ReportFragment>;

/**
 * Lengths in the chosen model's tokens come only when its GGUF is in the mirror, otherwise `tokensNote` says why;
 * an upload that names no model gets neither key in its JSON.
 */
export type TrainDataReport = Omit<WholeReport, 'tokens' | 'tokensNote'> &
  Partial<Pick<WholeReport, 'tokens' | 'tokensNote'>>;

export const TRAIN_DATA_URL = '/api/train/data';

export type UploadAnswer = { ok: true; report: TrainDataReport } | { ok: false; message: string };

/**
 * Sends the file as it is (the browser sets its Content-Length, which the server needs) with the session's CSRF
 * header, as the GraphQL client does. A refusal comes back in the server's words ({"error": "…"}).
 */
export async function uploadTrainData(
  file: Blob,
  fetchImpl: typeof fetch = fetch,
  o: { model?: string; maxLen?: number } = {},
): Promise<UploadAnswer> {
  // With the model, the server also counts tokens with its tokenizer (and pairs past max_len).
  const query = new URLSearchParams();
  if (o.model) query.set('model', o.model);
  if (o.model && o.maxLen) query.set('max_len', String(o.maxLen));
  const url = query.size ? `${TRAIN_DATA_URL}?${query}` : TRAIN_DATA_URL;
  let response: Response;
  try {
    response = await fetchImpl(url, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'content-type': 'application/x-ndjson', ...csrfHeaders() },
      body: file,
    });
  } catch (err) {
    return { ok: false, message: `Could not reach the Hangar server: ${(err as Error).message}` };
  }
  const body = (await response.json().catch(() => null)) as (TrainDataReport & { error?: string }) | null;
  if (!response.ok || !body || typeof body.sha256 !== 'string') {
    const why = body?.error ?? `the server answered ${response.status} ${response.statusText}`.trim();
    return { ok: false, message: `The pairs were not checked: ${why}` };
  }
  return { ok: true, report: body };
}

const plural = (n: number, one: string, many = `${one}s`) => `${n.toLocaleString('en')} ${n === 1 ? one : many}`;

/** The report in one line: "120 pairs · 48.2 KiB · sha256 1a2b3c4d5e6f…". */
export function reportSummary(r: TrainDataReport): string {
  return `${plural(r.pairs, 'pair')} · ${formatBytes(r.bytes)} · sha256 ${shortSha(r.sha256)}`;
}

/** Whether the job can be submitted with these pairs, and if not what to do. */
export function reportVerdict(r: TrainDataReport): string {
  if (r.errorCount > 0)
    return `${plural(r.errorCount, 'line is', 'lines are')} not a pair: fix ${r.errorCount === 1 ? 'it' : 'them'} and choose the file again.`;
  if (r.pairs === 0) return 'The file holds no pairs: each line is {"q": "…", "a": "…"}.';
  return r.duplicateCount > 0
    ? `Ready to train on. ${plural(r.duplicateCount, 'pair repeats', 'pairs repeat')} an earlier one: ${r.duplicateCount === 1 ? 'it counts' : 'they count'} twice.`
    : 'Ready to train on.';
}

/** Lengths in characters: "min 12 · median 40 · mean 41.5 · p95 80 · max 200". */
export function lengthLine(s: LengthStats | null): string {
  if (!s) return '—';
  return `min ${s.min} · median ${s.p50} · mean ${s.mean} · p95 ${s.p95} · max ${s.max}`;
}

/** "and 12 more" when the report shows only the first few of its bad lines or duplicates. */
export function moreThanShown(shown: number, count: number): string | null {
  return count > shown ? `and ${(count - shown).toLocaleString('en')} more` : null;
}
