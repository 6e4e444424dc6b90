import { CopyButton } from '../common/copy-button';
import { lengthLine, moreThanShown, reportSummary, reportVerdict, type TrainDataReport } from './train-data';

/**
 * The server's report on the chosen pairs, before anything is submitted: how many, how big, their sha256 (what
 * the job will name them by), the lines that are not pairs by number, the repeats, and how long questions and
 * answers are.
 */
export function DataReport({ file, report }: { file: string; report: TrainDataReport }) {
  return (
    <section className={`data-report ${report.ok ? 'ok' : 'bad'}`} aria-label={`Report on ${file}`}>
      <p className="data-summary">
        <span>
          <strong>{file}</strong>: {reportSummary(report)}
        </span>
        <CopyButton text={report.sha256} label="Copy sha256" />
      </p>
      <p role="status" className={report.ok ? 'notice' : 'form-error'}>
        {reportVerdict(report)}
      </p>
      {report.errors.length ? (
        <div>
          <h3 className="report-heading">Lines that are not pairs</h3>
          <ul className="report-lines">
            {report.errors.map((e) => (
              <li key={e.line}>
                <span className="mono">line {e.line}</span>: {e.message}
              </li>
            ))}
            {moreThanShown(report.errors.length, report.errorCount) ? (
              <li className="muted">{moreThanShown(report.errors.length, report.errorCount)}</li>
            ) : null}
          </ul>
        </div>
      ) : null}
      {report.duplicates.length ? (
        <div>
          <h3 className="report-heading">Repeated pairs</h3>
          <ul className="report-lines">
            {report.duplicates.map((d) => (
              <li key={d.line}>
                <span className="mono">line {d.line}</span> repeats line {d.sameAs}
              </li>
            ))}
            {moreThanShown(report.duplicates.length, report.duplicateCount) ? (
              <li className="muted">{moreThanShown(report.duplicates.length, report.duplicateCount)}</li>
            ) : null}
          </ul>
        </div>
      ) : null}
      {report.pairs > 0 ? (
        <dl className="report-lengths">
          <div>
            <dt>Questions</dt>
            <dd>{lengthLine(report.question)} characters</dd>
          </div>
          <div>
            <dt>Answers</dt>
            <dd>{lengthLine(report.answer)} characters</dd>
          </div>
          {report.tokens ? (
            <>
              <div>
                <dt>In tokens</dt>
                <dd>
                  questions {lengthLine(report.tokens.question)} · answers {lengthLine(report.tokens.answer)} (
                  {report.tokens.model}'s tokenizer)
                </dd>
              </div>
              <div>
                <dt>Past max_len</dt>
                <dd className={report.tokens.overMaxLen ? 'form-error' : undefined}>
                  {report.tokens.overMaxLen
                    ? `${report.tokens.overMaxLen} of ${report.pairs} pairs are longer than ${report.tokens.maxLen} tokens: the trainer cuts their answers short, or drops them`
                    : `none: the longest pair is ${report.tokens.pair.max} tokens, max_len ${report.tokens.maxLen}`}
                </dd>
              </div>
            </>
          ) : report.tokensNote ? (
            <div>
              <dt>In tokens</dt>
              <dd className="muted">{report.tokensNote}</dd>
            </div>
          ) : null}
          {report.collections.length ? (
            <div>
              <dt>From collections</dt>
              <dd className="mono">{report.collections.join(', ')}</dd>
            </div>
          ) : null}
        </dl>
      ) : null}
    </section>
  );
}
