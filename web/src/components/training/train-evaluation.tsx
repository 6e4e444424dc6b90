import { graphql, type ResultOf } from '../../graphql/graphql';
import { DataTable } from '../common/data-table';

// How the job's adapter compared with its base on questions it was not trained on (#32): the verdicts, each
// measure with its interval, and every question with both answers side by side, so the operator can read what
// changed before publishing, not only a number.

export const TrainEvaluation_JobFragment = graphql(`
  fragment TrainEvaluation_Job on TrainJob {
    id
    state
    heldOut
    evaluation {
      heldOut
      seed
      verdict
      forgettingVerdict
      metrics {
        set
        name
        base
        adapter
        difference
        low
        high
      }
      questions {
        set
        question
        reference
        baseAnswer
        adapterAnswer
        baseF1
        adapterF1
      }
    }
  }
`);

type Job = ResultOf<typeof TrainEvaluation_JobFragment>;

export const VERDICT_TEXT: Record<string, { text: string; tone: string }> = {
  BETTER: { text: 'better than the base', tone: 'ok' },
  WORSE: { text: 'worse than the base', tone: 'bad' },
  NO_CLEAR_DIFFERENCE: { text: 'no clear difference', tone: 'idle' },
  INSUFFICIENT_DATA: { text: 'too few questions to tell', tone: 'idle' },
};

const METRIC_TEXT: Record<string, string> = {
  tokenF1: 'Token F1',
  exactMatch: 'Exact match',
  rougeL: 'ROUGE-L',
  logLikelihood: 'Log-likelihood of the reference, per token',
  perplexity: 'Perplexity of the reference (lower is better)',
};

const num = (x: number) => (Math.abs(x) >= 100 ? x.toFixed(0) : x.toFixed(3));
const signed = (x: number) => (x >= 0 ? `+${num(x)}` : num(x));

export function VerdictBadge({ verdict }: { verdict: string }) {
  const v = VERDICT_TEXT[verdict] ?? { text: verdict, tone: 'idle' };
  return <span className={`badge ${v.tone}`}>{v.text}</span>;
}

export function TrainEvaluation({ job }: { job: Job }) {
  const e = job.evaluation;
  if (!e)
    return (
      <section className="panel train-evaluation" aria-label="Evaluation">
        <h2>Evaluation against the base</h2>
        <p className="muted">
          {job.state === 'DONE' || job.state === 'FAILED' || job.state === 'CANCELLED'
            ? 'Not evaluated: the events say why.'
            : `${job.heldOut} pairs are held out (never trained on). After training, the node has the base and the adapter answer them, and general questions, and compares the two here.`}
        </p>
      </section>
    );
  return (
    <section className="panel train-evaluation" aria-label="Evaluation" data-testid="train-evaluation">
      <h2>Evaluation against the base</h2>
      <dl className="facts">
        <div>
          <dt>Its own held-out pairs ({e.heldOut})</dt>
          <dd>
            <VerdictBadge verdict={e.verdict} />
          </dd>
        </div>
        <div>
          <dt>General questions (forgetting)</dt>
          <dd>
            <VerdictBadge verdict={e.forgettingVerdict} />
          </dd>
        </div>
        <div>
          <dt>Seed</dt>
          <dd className="mono">{e.seed}</dd>
        </div>
      </dl>
      <p className="hint">
        Both answered greedily with the same seed. A verdict needs the 95 % interval of the difference, over the
        questions, wholly above or below zero for token F1 or the reference&apos;s log-likelihood, by more than 0.02 F1
        or 0.05 nats per token.
      </p>
      <DataTable
        label="Measures, base against adapter"
        columns={[
          'Set',
          'Measure',
          { label: 'Base', className: 'num' },
          { label: 'Adapter', className: 'num' },
          { label: 'Change', className: 'num' },
          '95 % CI',
        ]}
      >
        <tbody>
          {e.metrics.map((m) => (
            <tr key={`${m.set}.${m.name}`}>
              <td>{m.set === 'pairs' ? 'held-out pairs' : 'general'}</td>
              <td>{METRIC_TEXT[m.name] ?? m.name}</td>
              <td className="num">{num(m.base)}</td>
              <td className="num">{num(m.adapter)}</td>
              <td className="num">{signed(m.difference)}</td>
              <td className="mono">
                {signed(m.low)} to {signed(m.high)}
              </td>
            </tr>
          ))}
        </tbody>
      </DataTable>
      <h3>The questions, side by side</h3>
      <DataTable
        label="The questions, side by side"
        className="eval-questions"
        columns={[
          'Question',
          'Reference',
          'Base answered',
          'Adapter answered',
          { label: 'F1 base → adapter', className: 'num' },
        ]}
      >
        <tbody>
          {e.questions.map((q) => (
            <tr key={`${q.set}:${q.question}`} className={q.set === 'general' ? 'muted-row' : undefined}>
              <td>
                {q.set === 'general' ? <span className="badge idle">general</span> : null} {q.question}
              </td>
              <td>{q.reference}</td>
              <td className="answer">{q.baseAnswer || <span className="muted">(nothing)</span>}</td>
              <td className="answer">{q.adapterAnswer || <span className="muted">(nothing)</span>}</td>
              <td className="num">
                {q.baseF1.toFixed(2)} → {q.adapterF1.toFixed(2)}
              </td>
            </tr>
          ))}
        </tbody>
      </DataTable>
    </section>
  );
}
