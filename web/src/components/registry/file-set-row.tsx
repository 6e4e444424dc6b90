import { type FormEvent, useId, useState } from 'react';
import { useMutation, useQuery, useSubscription } from 'urql';
import { type Answer, graphql, type ResultOf } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { arrivingStates, isRefusal } from '../../graphql/types';
import { formatBytes, formatCount, shortSha } from '../../lib/format';
import { DataTable } from '../common/data-table';
import { Field } from '../common/field';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { FetchForm_StartedFragment } from '../mirror/fetch-form';
import { stateBadge } from '../mirror/mirror-parts';
import { useMirrorListingUpdates } from '../mirror/mirror-updates';
import { VersionRow_VersionFragment } from '../mirror/version-row';
import { FitsText, MemoryText, VerdictText } from './registry-parts';

/** What the set's header says it is (the name's guess only where the header could not be read). */
export type FileSetKind = 'MODEL' | 'ADAPTER' | 'MMPROJ' | 'IMATRIX';

export type FileSetRow_Set = ResultOf<typeof FileSetRow_SetFragment>;

export const FileSetRow_SetFragment = graphql(`
  fragment FileSetRow_Set on FileSet {
    id
    kind
    format
    quant
    files {
      path
      size
      sha256
    }
    shardCount
    complete
    totalBytes
    model
    version
    headerBytesRead
    headerError
    header {
      architecture
      contextLength
      layers
      embeddingLength
      heads
      kvHeads
      fileType
      parameterCount
    }
    verdict {
      servable
      reason
      neededBuild
    }
    memory {
      context
      weightsBytes
      kvCacheBytes
      overheadBytes
      totalBytes
      basis
    }
    fits {
      summary
      disk {
        fits
        freeBytes
        neededBytes
      }
      nodes {
        node
        fits
        freeMiB
        neededMiB
        reason
      }
    }
  }
`);

type Started = Answer<typeof FileSetRow_FetchMutation, 'fetchRepoSet', 'FetchStarted'>;

/**
 * The revision is the one the verdict was made for, so a push to the repository meanwhile cannot swap the files
 * judged. The new version joins the mirror's listing above, when there is one (mirror-updates.ts).
 */
export const FileSetRow_FetchMutation = graphql(
  `
  mutation FileSetRow_Fetch(
    $repo: String!
    $revision: String
    $set: String!
    $model: String
    $version: String
    $force: Boolean
  ) {
    fetchRepoSet(repo: $repo, revision: $revision, set: $set, model: $model, version: $version, force: $force) {
      __typename
      ...FetchForm_Started
      ...FormError_Refusal
    }
  }
`,
  [FetchForm_StartedFragment, FormError_RefusalFragment],
);

/** The version as it is now: a small set can be present before its subscription opens. */
export const FileSetRow_VersionQuery = graphql(
  `
  query FileSetRow_Version($model: String!, $version: String!) {
    mirrorVersion(model: $model, version: $version) {
      ...VersionRow_Version
    }
  }
`,
  [VersionRow_VersionFragment],
);

/** Each change of the version just started, whole: graphcache updates it by id, here and in the mirror's listing. */
export const FileSetRow_VersionChangedSubscription = graphql(
  `
  subscription FileSetRow_VersionChanged($model: String!, $version: String!) {
    mirrorVersionChanged(model: $model, version: $version) {
      ...VersionRow_Version
    }
  }
`,
  [VersionRow_VersionFragment],
);

/**
 * Serving the set in one step: the server fetches it into the mirror, checks it, puts it in the catalog, places a
 * replica and smoke-tests it, as a job. The job is then watched live (serve-job.tsx).
 */
// Only the job's id: the job view reads and follows the job itself. (Its nullable `message` could not sit beside
// the refusal's non-null `message` in one selection anyway: GraphQL refuses fields of the same name and other types.)
export const FileSetRow_ServeMutation = graphql(
  `
  mutation FileSetRow_Serve($repo: String!, $quant: String, $file: String, $onDemand: Boolean) {
    serveFromRegistry(repo: $repo, quant: $quant, file: $file, onDemand: $onDemand) {
      __typename
      ... on ServeJob {
        id
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

const kindWords: Record<FileSetKind, string> = {
  MODEL: 'model',
  ADAPTER: 'LoRA adapter',
  MMPROJ: 'mmproj',
  IMATRIX: 'imatrix',
};

/** What the operator scans for: the quantisation; a side file says what it is. */
export function setLabel(set: FileSetRow_Set): string {
  const name = set.quant ?? set.id.replace(/^[a-z]+:/, '');
  return set.kind === 'MODEL' ? name : `${kindWords[set.kind]} ${set.quant ?? ''}`.trim();
}

function filesWord(set: FileSetRow_Set): string {
  if (set.shardCount > 1) {
    return set.complete ? `${set.shardCount} shards` : `${set.files.length} of ${set.shardCount} shards`;
  }
  return set.files.length === 1 ? '1 file' : `${set.files.length} files`;
}

/** What the header says, in one line: "qwen3 · 36 layers · 8.2B parameters · trained for 40,960 tokens". */
function headerLine(header: NonNullable<FileSetRow_Set['header']>): string {
  const parts = [header.architecture ?? 'no architecture'];
  if (header.layers) parts.push(`${header.layers} layers`);
  if (header.parameterCount) parts.push(`${formatCount(header.parameterCount)} parameters`);
  if (header.contextLength) parts.push(`trained for ${header.contextLength.toLocaleString('en')} tokens`);
  return parts.join(' · ');
}

/**
 * One set of a repository: its size, verdict, memory estimate and fits, and the names it is fetched under. The
 * server's answer stays beside the set: "started fetching…", or its refusal word for word. A set the verdict says
 * cannot be served has no Fetch button: its reason is in the verdict column, and taking it regardless is a
 * choice made on purpose, behind "Fetch anyway…" and a tick that says what it means.
 */
export function FileSetRow({
  repo,
  set,
  canFetch,
  columns,
  noAccessId,
  onServe,
}: {
  repo: { id: string; revision: string; noAccess: string | null };
  set: FileSetRow_Set;
  canFetch: boolean;
  /** How many columns the sets table has, for the rows that span it. */
  columns: number;
  /** The id of the repository's "no access" notice, which explains a disabled button. */
  noAccessId?: string;
  /** Called with the id of a serve job started from this set. */
  onServe?: (job: string) => void;
}) {
  const [filesOpen, setFilesOpen] = useState(false);
  const [model, setModel] = useState(set.model);
  const [version, setVersion] = useState(set.version);
  const [{ fetching, error }, fetchSet] = useMutation(FileSetRow_FetchMutation);
  const listing = useMirrorListingUpdates();
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [confirmed, setConfirmed] = useState(false);
  const [started, setStarted] = useState<Started>();
  const filesId = useId();
  const label = setLabel(set);

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    setRefusal(null);
    setStarted(undefined);
    const result = await fetchSet({
      repo: repo.id,
      revision: repo.revision,
      set: set.id,
      model: model.trim(),
      version: version.trim(),
      // Only reached for an unservable set through the confirmed "Fetch anyway".
      force: !set.verdict.servable,
    });
    const outcome = result.data?.fetchRepoSet;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome?.__typename === 'FetchStarted') {
      // Under the Mirror page, its listing shows the new version (reading itself again to place it).
      listing.put(outcome.version);
      setStarted(outcome);
      setConfirmed(false);
    }
  };
  // The last answer is about the names it was sent with: once they change, it goes.
  const edited = () => {
    setStarted(undefined);
    if (refusal?.__typename === 'ValidationError') setRefusal(null);
  };

  const field = refusal?.__typename === 'ValidationError' ? refusal.field : undefined;
  const fieldError = (name: 'model' | 'version') => (field === name ? refusal?.message : undefined);
  const placed = field === 'model' || field === 'version';
  const [serveState, serveSet] = useMutation(FileSetRow_ServeMutation);
  const [onDemand, setOnDemand] = useState(false);
  const [serveRefusal, setServeRefusal] = useState<Refusal | null>(null);
  const servable = set.kind === 'MODEL' && set.format === 'GGUF' && onServe != null;
  const serve = async () => {
    setServeRefusal(null);
    const result = await serveSet({
      repo: repo.id,
      quant: set.quant,
      file: set.quant ? null : (set.files[0]?.path ?? null),
      onDemand,
    });
    const outcome = result.data?.serveFromRegistry;
    if (isRefusal(outcome)) setServeRefusal(outcome);
    else if (outcome?.__typename === 'ServeJob') onServe?.(outcome.id);
  };
  const answered = started || (refusal && !placed) || error || serveRefusal || serveState.error;

  // The names the set lands under, the same in the plain form and behind "Fetch anyway…".
  const nameFields = (
    <>
      <Field
        label="Model"
        inputClassName="set-input"
        value={model}
        spellCheck={false}
        error={fieldError('model')}
        onChange={(e) => {
          edited();
          setModel(e.target.value);
        }}
      />
      <Field
        label="Version"
        inputClassName="set-input"
        value={version}
        spellCheck={false}
        error={fieldError('version')}
        onChange={(e) => {
          edited();
          setVersion(e.target.value);
        }}
      />
    </>
  );
  return (
    <>
      <tr data-testid={`set-${set.id}`} className={`set${set.verdict.servable ? '' : ' not-servable'}`}>
        <th scope="row" className="set-cell" title={set.id}>
          <span className="set-name">{label}</span>
          {set.format === 'SAFETENSORS' ? <span className="badge muted">safetensors</span> : null}
          <div className="sub">
            <button
              type="button"
              className="link-button"
              aria-expanded={filesOpen}
              aria-controls={filesId}
              onClick={() => setFilesOpen((o) => !o)}
            >
              {filesWord(set)}
            </button>
          </div>
          {set.header ? (
            <div className="sub header-line" title={`judged from the first ${formatBytes(set.headerBytesRead)}`}>
              {headerLine(set.header)}
            </div>
          ) : null}
        </th>
        <td className="set-cell num size" data-label="Size">
          {formatBytes(set.totalBytes)}
        </td>
        <td className="set-cell verdict-cell" data-label="Verdict">
          <VerdictText verdict={set.verdict} />
        </td>
        <td className="set-cell memory-cell" data-label="Memory">
          <MemoryText memory={set.memory} />
        </td>
        <td className="set-cell fits-cell" data-label="Fits">
          <FitsText fits={set.fits} label={label} />
        </td>
        {canFetch ? (
          <td className="set-cell fetch-cell">
            {set.verdict.servable ? (
              <form className="set-fetch" aria-label={`Fetch ${label}`} onSubmit={submit} noValidate>
                {nameFields}
                <button
                  type="submit"
                  className={`button small fetch-button${repo.noAccess ? '' : ' primary'}`}
                  disabled={fetching || repo.noAccess != null}
                  aria-describedby={repo.noAccess ? noAccessId : undefined}
                  title={repo.noAccess ?? undefined}
                >
                  Fetch
                </button>
                {repo.noAccess ? <span className="sub">no access: see above</span> : null}
              </form>
            ) : (
              <details className="fetch-anyway">
                <summary>Fetch anyway…</summary>
                <form className="set-fetch" aria-label={`Fetch ${label} anyway`} onSubmit={submit} noValidate>
                  {nameFields}
                  <label className="check anyway-choice">
                    <input type="checkbox" checked={confirmed} onChange={(e) => setConfirmed(e.target.checked)} /> Fetch
                    it although it cannot be served here
                  </label>
                  <button
                    type="submit"
                    className="button small danger fetch-button"
                    disabled={!confirmed || fetching || repo.noAccess != null}
                    aria-describedby={repo.noAccess ? noAccessId : undefined}
                    title={repo.noAccess ?? undefined}
                  >
                    Fetch anyway
                  </button>
                  {repo.noAccess ? <span className="sub">no access: see above</span> : null}
                </form>
              </details>
            )}
            {servable ? (
              <div className="set-serve">
                <button
                  type="button"
                  className="button small"
                  disabled={serveState.fetching || repo.noAccess != null}
                  title="Fetch, check, put in the catalog, start a replica and smoke-test it, in one job"
                  onClick={serve}
                >
                  Serve
                </button>
                <label className="checkbox">
                  <input type="checkbox" checked={onDemand} onChange={(e) => setOnDemand(e.target.checked)} /> on demand
                </label>
              </div>
            ) : null}
          </td>
        ) : null}
      </tr>
      {filesOpen ? (
        <tr className="set-files" id={filesId}>
          <td colSpan={columns}>
            <SetFiles files={set.files} label={`Files of ${label}`} />
          </td>
        </tr>
      ) : null}
      {answered ? (
        <tr className="set-answer">
          <td colSpan={columns}>
            {started ? (
              <FetchAnswer started={started} />
            ) : (
              <FormError refusal={placed ? null : refusal} error={error} />
            )}
            <FormError refusal={serveRefusal} error={serveState.error} />
          </td>
        </tr>
      ) : null}
    </>
  );
}

function SetFiles({ files, label }: { files: FileSetRow_Set['files']; label: string }) {
  return (
    <DataTable
      wrap={false}
      className="dense files"
      label={label}
      columns={['File', { label: 'Size', className: 'num' }, 'sha256']}
    >
      <tbody>
        {files.map((f) => (
          <tr key={f.path}>
            <th scope="row" className="mono">
              {f.path}
            </th>
            <td className="num">{formatBytes(f.size)}</td>
            <td>
              {f.sha256 ? (
                <code title={f.sha256}>{shortSha(f.sha256)}</code>
              ) : (
                <span className="muted" title="The registry publishes no sha256 for it: it arrives unverified">
                  none published
                </span>
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </DataTable>
  );
}

/**
 * The server's words ("started fetching 1 file into tiny/feedbee"), then the version as it arrives: named as
 * started, since the bytes are still moving; the mirror's listing shows the rest.
 */
function FetchAnswer({ started }: { started: Started }) {
  const vars = { model: started.version.model, version: started.version.version };
  const [{ data }] = useQuery({ query: FileSetRow_VersionQuery, variables: vars, requestPolicy: 'cache-and-network' });
  const [{ data: event }] = useSubscription({ query: FileSetRow_VersionChangedSubscription, variables: vars });
  // The read and the events race: a read answered before the last event but delivered after it would otherwise
  // leave "verifying 99.9 %" beside a version the listing shows present. The further along of the two is shown.
  const version = furtherAlong(event?.mirrorVersionChanged, data?.mirrorVersion) ?? started.version;
  const arriving = arrivingStates.includes(version.state);
  return (
    <div className="fetch-answer">
      <p role="status" className="notice">
        {started.message}
      </p>
      <p className="answer-state">
        <span className="visually-hidden">
          {vars.model}/{vars.version} is now{' '}
        </span>
        {stateBadge(version.state)}
        {arriving && version.percent != null ? <span className="muted"> {version.percent.toFixed(1)} %</span> : null}
        {arriving && version.percent == null && version.bytesDone > 0 ? (
          <span className="muted"> {formatBytes(version.bytesDone)} so far</span>
        ) : null}
        {version.state === 'FAILED' && version.error ? <span className="form-error"> {version.error}</span> : null}
      </p>
    </div>
  );
}

type ShownVersion = Started['version'];

// How far a version just started has come: its end (present, failed, cancelled) after verifying after fetching.
const STAGE: Record<string, number> = { QUEUED: 0, PAUSED: 1, FETCHING: 1, VERIFYING: 2 };

/**
 * Of two readings of one version, the later written one; between two of the same write (progress moves bytes
 * without writing the row), the one further along (by stage, then bytes); the event on a tie. The write time comes
 * first because a version can go back: a failed fetch retried is QUEUED again, and a read that still says FAILED
 * must not hold the answer at FAILED for good.
 */
export function furtherAlong<V extends Pick<ShownVersion, 'state' | 'bytesDone' | 'updatedAt'>>(
  event: V | null | undefined,
  read: V | null | undefined,
): V | undefined {
  if (!event || !read) return event ?? read ?? undefined;
  const written = (v: V) => (v.updatedAt ? Date.parse(String(v.updatedAt)) : Number.NaN);
  const [e, r] = [written(event), written(read)];
  if (!Number.isNaN(e) && !Number.isNaN(r) && e !== r) return r > e ? read : event;
  const stage = (v: V) => STAGE[v.state] ?? 3;
  if (stage(read) !== stage(event)) return stage(read) > stage(event) ? read : event;
  return read.bytesDone > event.bytesDone ? read : event;
}
