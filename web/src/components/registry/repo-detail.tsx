import { type FormEvent, useId, useRef, useState } from 'react';
import { useQuery } from 'urql';
import { type Answer, graphql } from '../../graphql/graphql';
import { isRefusal } from '../../graphql/types';
import { DataTable } from '../common/data-table';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { FileSetRow, FileSetRow_SetFragment } from './file-set-row';
import { ServeJob } from './serve-job';

export type RepoDetail_Repo = Answer<typeof RepoDetail_RepoQuery, 'registryRepo', 'RegistryRepo'>;

/** Every set judged (verdict, memory at `context`, fits) before a byte of weights moves. */
export const RepoDetail_RepoQuery = graphql(
  `
  query RepoDetail_Repo($id: String!, $context: Int) {
    registryRepo(id: $id, context: $context) {
      __typename
      ... on RegistryRepo {
        id
        revision
        shortRevision
        gated
        noAccess
        architecture
        url
        cardHtml
        sets {
          ...FileSetRow_Set
        }
      }
      ...FormError_Refusal
    }
  }
`,
  [FileSetRow_SetFragment, FormError_RefusalFragment],
);

const tokens = new Intl.NumberFormat('en');

/**
 * One repository, opened beneath its row: what it is, its sets as the fleet would meet them, and its card. A
 * new context keeps the sets on screen while they are estimated again, so the table does not blink away.
 */
export function RepoDetail({
  id,
  context,
  onContextChange,
  onClose,
  canFetch,
  job: jobControlled,
  onJobChange,
}: {
  id: string;
  context: number | undefined;
  onContextChange: (context: number | undefined) => void;
  onClose: () => void;
  canFetch: boolean;
  /** The serve job started here (kept in the URL by the route, so a reload re-attaches to it). */
  job?: string;
  onJobChange?: (job: string | undefined) => void;
}) {
  const [localJob, setLocalJob] = useState<string>();
  const job = onJobChange ? jobControlled : localJob;
  const setJob = onJobChange ?? setLocalJob;
  const [{ data, fetching, error }] = useQuery({
    query: RepoDetail_RepoQuery,
    variables: { id, context: context ?? null },
    // Read again on each opening: the fleet's free memory and the mirror's disk change.
    requestPolicy: 'cache-and-network',
  });
  const titleId = useId();
  const noAccessId = useId();
  const result = data?.registryRepo;
  const lastRef = useRef<RepoDetail_Repo>(undefined);
  if (result?.__typename === 'RegistryRepo') lastRef.current = result;
  const repo = lastRef.current;
  const refusal = isRefusal(result) ? result : undefined;
  const contextError = refusal?.__typename === 'ValidationError' && refusal.field === 'context' ? refusal : undefined;
  const columns = canFetch ? 6 : 5;

  return (
    <section className="repo-detail" aria-labelledby={titleId}>
      <div className="repo-head">
        <h3 id={titleId}>{id}</h3>
        {repo ? (
          <>
            <code title={`revision ${repo.revision}`}>{repo.shortRevision}</code>
            {repo.architecture ? <span className="muted">{repo.architecture}</span> : null}
            {repo.gated ? <span className="badge warn">gated</span> : null}
            <a href={repo.url} target="_blank" rel="noreferrer">
              Open on the registry
            </a>
          </>
        ) : null}
        <button type="button" className="button small close" onClick={onClose}>
          Close
        </button>
      </div>
      {repo?.noAccess ? (
        <p id={noAccessId} className="access-warning">
          <strong>No access:</strong> {repo.noAccess}
        </p>
      ) : null}
      {refusal && !contextError ? (
        <p role="alert" className="form-error">
          {refusal.message}
        </p>
      ) : null}
      <FormError error={error} />
      {job ? <ServeJob id={job} onClose={() => setJob(undefined)} /> : null}
      {!repo && fetching ? <p className="muted">Reading {id}: its files, and the header of each set…</p> : null}
      {repo && !(refusal && !contextError) ? (
        <>
          <ContextForm
            key={context ?? 'own'}
            context={context}
            used={repo.sets.map((s) => s.memory?.context).filter((c): c is number => c != null)}
            error={contextError?.message}
            estimating={fetching}
            onChange={onContextChange}
          />
          {repo.sets.length ? (
            <DataTable
              className="dense sets stack-narrow"
              label={`File sets of ${repo.id}`}
              columns={[
                'Set',
                { label: 'Size', className: 'num' },
                'Verdict',
                'Memory',
                'Fits',
                canFetch && 'Fetch into the mirror',
              ]}
            >
              <tbody>
                {repo.sets.map((set) => (
                  <FileSetRow
                    key={set.id}
                    repo={repo}
                    set={set}
                    canFetch={canFetch}
                    columns={columns}
                    noAccessId={noAccessId}
                    onServe={setJob}
                  />
                ))}
              </tbody>
            </DataTable>
          ) : (
            <p className="empty">No weights here: the repository holds no GGUF or safetensors files.</p>
          )}
          {repo.cardHtml ? (
            <details className="card">
              <summary>Model card</summary>
              {/* Rendered and sanitized by the server (scripts, handlers and styles removed). */}
              {/* biome-ignore lint/security/noDangerouslySetInnerHtml: the server sanitizes the card. */}
              <div className="card-body" dangerouslySetInnerHTML={{ __html: repo.cardHtml }} />
            </details>
          ) : (
            <p className="muted">The repository has no model card.</p>
          )}
        </>
      ) : null}
    </section>
  );
}

/**
 * The context the memory estimates are for. Empty means each model's own, capped by the server; when the sets
 * agree on what that came to, the empty field shows it.
 * Applied on Enter or with the button, not on each keystroke: each asks the registry again.
 */
function ContextForm({
  context,
  used,
  error,
  estimating,
  onChange,
}: {
  context: number | undefined;
  used: number[];
  error?: string;
  estimating: boolean;
  onChange: (context: number | undefined) => void;
}) {
  const [text, setText] = useState(context == null ? '' : String(context));
  const [problem, setProblem] = useState<string>();
  const inputId = useId();
  const own = [...new Set(used)];

  const submit = (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const value = text.trim();
    if (value === '') return onChange(undefined);
    const n = Number(value);
    if (!Number.isInteger(n) || n <= 0) return setProblem(`a whole number of tokens, such as 8192: '${value}' is not`);
    onChange(n);
  };
  const message = problem ?? error;

  return (
    <form className="context-form" aria-label="Memory estimate" onSubmit={submit} noValidate>
      <div className="field">
        <label htmlFor={inputId}>Context</label>
        <input
          id={inputId}
          className="context-input"
          type="number"
          inputMode="numeric"
          min={1}
          step={1}
          value={text}
          placeholder={context == null && own.length === 1 ? String(own[0]) : "model's own"}
          aria-invalid={message ? true : undefined}
          aria-describedby={message ? `${inputId}-error` : `${inputId}-hint`}
          onChange={(e) => {
            setProblem(undefined);
            setText(e.target.value);
          }}
        />
      </div>
      <button type="submit" className="button small" disabled={estimating}>
        Estimate
      </button>
      {message ? (
        <p id={`${inputId}-error`} role="alert" className="form-error field-error">
          {message}
        </p>
      ) : (
        <p id={`${inputId}-hint`} className="hint">
          {estimating
            ? 'Estimating again…'
            : context == null
              ? "Tokens of context the memory is estimated for. Empty: each model's own, capped by the server."
              : `Estimated at ${tokens.format(context)} tokens. Empty the field for each model's own.`}
        </p>
      )}
    </form>
  );
}
