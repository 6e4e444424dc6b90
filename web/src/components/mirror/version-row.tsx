import { memo, useEffect, useRef, useState } from 'react';
import { type CombinedError, useMutation } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { ModelMode, Outcome } from '../../graphql/types';
import { arrivingStates, isRefusal } from '../../graphql/types';
import { formatBytes, formatDuration, formatRate } from '../../lib/format';
import { CopyButton } from '../common/copy-button';
import { describeError, FormError_RefusalFragment } from '../common/form-error';
import { ConfirmButton, InlineProblem } from '../common/form-parts';
import { PageLink } from '../common/page-link';
import { TimeAgo } from '../common/time-ago';
import { BreakableUrl, modeWords, stateBadge, VerifiedBadge } from './mirror-parts';
import { useMirrorListingUpdates } from './mirror-updates';
import { RemoveVersion } from './remove-version';
import { useSettled } from './scroll-settle';
import { ServeForm } from './serve-form';
import { VersionFiles, VersionFiles_FileFragment } from './version-files';

export const VersionRow_SetModeMutation = graphql(
  `
  mutation VersionRow_SetMode($name: String!, $mode: ModelMode!, $replicas: Int) {
    setModelMode(name: $name, mode: $mode, replicas: $replicas) {
      __typename
      ... on Model {
        id
        mode
        modeMessage
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

/**
 * How a catalog model that uses this version runs, changeable right here: the mode applies as it is chosen, and an
 * always-on model's replica count when it is typed (Enter, or leaving the field), as the seed's form did. What the
 * change means comes back in the server's words; the row updates when the server publishes the version again.
 */
function UsedByMode(props: { name: string; mode: ModelMode; replicas: number }) {
  // Scrolled into view: the controls' look-alikes until the list stops (scroll-settle.tsx says why).
  if (!useSettled()) {
    return (
      <>
        <span className="control-standin select">
          {(Object.keys(modeWords) as ModelMode[]).map((m) => (
            // Every choice in one place, the chosen one seen: as wide as the select, whichever it shows.
            <span key={m} className={m === props.mode ? undefined : 'unchosen'}>
              {modeWords[m]}
            </span>
          ))}
        </span>
        {props.mode === 'ALWAYS' ? (
          <span className="control-standin replicas-input">{Math.max(1, props.replicas)}</span>
        ) : null}
      </>
    );
  }
  return <UsedByModeControls {...props} />;
}

function UsedByModeControls({ name, mode, replicas }: { name: string; mode: ModelMode; replicas: number }) {
  const [result, setMode] = useMutation(VersionRow_SetModeMutation);
  const [refusal, setRefusal] = useState<string | null>(null);
  const [said, setSaid] = useState<string | null>(null);
  const [count, setCount] = useState(String(Math.max(1, replicas)));
  // The count last sent (or the model's own): leaving the field sends only a change, not the same count again.
  const sent = useRef(count);
  const apply = async (next: ModelMode, wanted: string) => {
    sent.current = wanted;
    setRefusal(null);
    setSaid(null);
    const n = Number(wanted);
    // Sent as typed, even out of range: the server's refusal says what is accepted.
    const r = await setMode({
      name,
      mode: next,
      ...(next === 'ALWAYS' && wanted.trim() !== '' && Number.isFinite(n) ? { replicas: n } : {}),
    });
    const answer = r.data?.setModelMode;
    if (r.error) setRefusal(describeError(r.error) ?? 'the change failed');
    else if (isRefusal(answer)) setRefusal(answer.message);
    else if (answer?.__typename === 'Model') setSaid(`${name}: ${answer.modeMessage}`);
  };
  return (
    <>
      <select
        aria-label={`Mode of ${name}`}
        value={mode}
        disabled={result.fetching}
        onChange={(e) => apply(e.target.value as ModelMode, count)}
      >
        {(Object.keys(modeWords) as ModelMode[]).map((m) => (
          <option key={m} value={m}>
            {modeWords[m]}
          </option>
        ))}
      </select>
      {mode === 'ALWAYS' ? (
        <input
          aria-label={`Replicas of ${name}`}
          className="replicas-input"
          type="number"
          min={1}
          step={1}
          value={count}
          disabled={result.fetching}
          onChange={(e) => setCount(e.target.value)}
          onBlur={() => {
            if (count !== sent.current) void apply('ALWAYS', count);
          }}
          onKeyDown={(e) => {
            if (e.key === 'Enter') {
              e.preventDefault();
              void apply('ALWAYS', count);
            }
          }}
        />
      ) : null}
      {refusal ? (
        <span role="alert" className="form-error">
          {refusal}
        </span>
      ) : null}
      {said ? (
        <span role="status" className="muted mode-said">
          {said}
        </span>
      ) : null}
    </>
  );
}

/** A catalog model using the version: `replicas` is the fewest it keeps running, `maxReplicas` the most it may run. */
type ModelUse = VersionRow_Version['usedBy'][number];

/** What a version holds, read by the server from its files' headers: only MODEL is served as a model. */
export type VersionKind = VersionRow_Version['kind'];

const modelPagePath = (name: string) => `/models/${encodeURIComponent(name)}`;

/**
 * In place of Serve, for a version that is not a model's weights: an adapter shows the models it belongs to (it is
 * called by its name on their replicas), or how it gets one; a projector or an importance matrix says what it is.
 * Serving one as a model plans fine and then fails on every node ("key not found in model: llama.context_length").
 */
function NotAModel({ version }: { version: VersionRow_Version }) {
  if (version.kind === 'ADAPTER') {
    const models = [...new Set(version.usedBy.flatMap((u) => (u.adapterOf ? [u.adapterOf] : [])))];
    if (models.length)
      return (
        <span className="not-a-model" data-testid="adapter-of">
          adapter of{' '}
          {models.map((m, i) => (
            <span key={m}>
              {i ? ', ' : ''}
              <PageLink to={modelPagePath(m)}>{m}</PageLink>
            </span>
          ))}
        </span>
      );
    return (
      <span className="not-a-model muted" data-testid="adapter-of">
        a LoRA adapter{version.architecture ? ` for ${version.architecture}` : ''}: publish it to a model
      </span>
    );
  }
  return (
    <span className="not-a-model muted">
      {version.kind === 'MMPROJ' ? 'a vision projector, loaded beside a model' : 'an importance matrix, not a model'}
    </span>
  );
}

/**
 * How many replicas a model using the version may run: the most, since an on-demand model keeps none running while
 * idle and "0 replicas" read as unused. Nothing for a stopped one: its mode says it.
 */
function replicaWords(u: ModelUse): string | null {
  if (u.maxReplicas === 0) return null;
  const count =
    u.replicas === u.maxReplicas || u.replicas === 0 ? `${u.maxReplicas}` : `${u.replicas}–${u.maxReplicas}`;
  return `${u.replicas === 0 ? 'up to ' : ''}${count} ${u.maxReplicas === 1 ? 'replica' : 'replicas'}`;
}

/** The whole version: the query, the subscription and every mutation select it, so each updates the row in place. */
export const VersionRow_VersionFragment = graphql(
  `
  fragment VersionRow_Version on MirrorVersion {
    id
    model
    version
    state
    removed
    fileCount
    files {
      ...VersionFiles_File
    }
    bytesDone
    bytesTotal
    percent
    bytesPerSecond
    etaSeconds
    retry {
      attempt
      nextAt
      reason
    }
    error
    verified
    url
    usedBy {
      name
      mode
      replicas
      maxReplicas
      declared
      adapterOf
    }
    kind
    architecture
    updatedAt
  }
`,
  [VersionFiles_FileFragment],
);

/** A version as every view of it selects it, typed from the fragment (gql.tada, from server/schema.graphql). */
export type VersionRow_Version = ResultOf<typeof VersionRow_VersionFragment>;

type VersionResult = { __typename: 'MirrorVersion' } & VersionRow_Version;

/** The result is the version: the row hands it to the listing (mirror-updates.ts), which shows it at once. */
export const VersionRow_CancelMutation = graphql(
  `
  mutation VersionRow_Cancel($model: String!, $version: String!) {
    cancelMirrorFetch(model: $model, version: $version) {
      __typename
      ...VersionRow_Version
      ...FormError_Refusal
    }
  }
`,
  [VersionRow_VersionFragment, FormError_RefusalFragment],
);

export const VersionRow_RetryMutation = graphql(
  `
  mutation VersionRow_Retry($model: String!, $version: String!) {
    retryMirrorFetch(model: $model, version: $version) {
      __typename
      ...VersionRow_Version
      ...FormError_Refusal
    }
  }
`,
  [VersionRow_VersionFragment, FormError_RefusalFragment],
);

/** Pause keeps what arrived; resume goes on from it with a Range request. */
export const VersionRow_PauseMutation = graphql(
  `
  mutation VersionRow_Pause($model: String!, $version: String!) {
    pauseMirrorFetch(model: $model, version: $version) {
      __typename
      ...VersionRow_Version
      ...FormError_Refusal
    }
  }
`,
  [VersionRow_VersionFragment, FormError_RefusalFragment],
);

export const VersionRow_ResumeMutation = graphql(
  `
  mutation VersionRow_Resume($model: String!, $version: String!) {
    resumeMirrorFetch(model: $model, version: $version) {
      __typename
      ...VersionRow_Version
      ...FormError_Refusal
    }
  }
`,
  [VersionRow_VersionFragment, FormError_RefusalFragment],
);

export const COLUMNS = 5;

/**
 * One version's row (and what opens beneath it). Memoised: the listing keeps the same object for a version that did
 * not change, so a live event about one version re-renders its row only, not the thousands beside it.
 */
export const VersionRow = memo(function VersionRow({
  version,
  canChange,
  serving = false,
  onServingChange,
}: {
  version: VersionRow_Version;
  canChange: boolean;
  /** Whether the serve form is open beneath the row (the route keeps it in the URL). */
  serving?: boolean;
  /** Opens or closes the serve form of the version named "model/version". */
  onServingChange?: (open: boolean, name: string) => void;
}) {
  const [open, setOpen] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const [cancelState, cancel] = useMutation(VersionRow_CancelMutation);
  const [retryState, retry] = useMutation(VersionRow_RetryMutation);
  const [pauseState, pause] = useMutation(VersionRow_PauseMutation);
  const [resumeState, resume] = useMutation(VersionRow_ResumeMutation);
  const [problem, setProblem] = useState<string>();
  const listing = useMirrorListingUpdates();
  const name = `${version.model}/${version.version}`;
  const arriving = arrivingStates.includes(version.state);
  // A cancelled version, a failed one, or one still arriving whose other files failed: the server retries those.
  const retryable = version.state === 'FAILED' || version.state === 'CANCELLED' || (arriving && version.error != null);
  const filesId = `files-${version.id}`;

  const vars = { model: version.model, version: version.version };
  const report = (outcome: Outcome<VersionResult> | undefined, error: CombinedError | undefined) => {
    if (isRefusal(outcome)) setProblem(outcome.message);
    else if (error) setProblem(describeError(error));
    // The answer is the version as it is now: its row shows it, without waiting for the event that follows.
    else if (outcome?.__typename === 'MirrorVersion') listing.put(outcome);
  };
  const onCancel = async () => {
    setProblem(undefined);
    const result = await cancel(vars);
    report(result.data?.cancelMirrorFetch, result.error);
  };
  const onRetry = async () => {
    setProblem(undefined);
    const result = await retry(vars);
    report(result.data?.retryMirrorFetch, result.error);
  };
  const onPause = async () => {
    setProblem(undefined);
    const result = await pause(vars);
    report(result.data?.pauseMirrorFetch, result.error);
  };
  const onResume = async () => {
    setProblem(undefined);
    const result = await resume(vars);
    report(result.data?.resumeMirrorFetch, result.error);
  };

  return (
    <>
      <tr data-testid={`version-${version.id}`} className={`version state-${version.state.toLowerCase()}`}>
        <th scope="row">
          <span className="version-name">
            {version.model}
            <span className="muted"> / </span>
            <span className="mono">{version.version}</span>
          </span>
          <div className="sub">
            <button
              type="button"
              className="link-button"
              aria-expanded={open}
              aria-controls={filesId}
              onClick={() => setOpen((o) => !o)}
            >
              {version.fileCount} {version.fileCount === 1 ? 'file' : 'files'}
            </button>
            {version.updatedAt ? (
              <>
                {' · '}
                <TimeAgo at={version.updatedAt} />
              </>
            ) : null}
          </div>
          {version.usedBy.length ? (
            <ul className="chips" aria-label={`Catalog models using ${name}`}>
              {version.usedBy.map((u) => (
                <li
                  key={u.name}
                  className="chip"
                  title={u.declared ? 'declared in hangar.yaml: change it there' : undefined}
                >
                  {u.adapterOf ? (
                    // An adapter's mode is its model's: changed there, not on the adapter.
                    <>
                      <PageLink to={modelPagePath(u.adapterOf)}>
                        adapter {u.name} of {u.adapterOf}
                      </PageLink>{' '}
                      ({modeWords[u.mode]})
                    </>
                  ) : (
                    <>
                      <PageLink to="/models">used by {u.name}</PageLink>{' '}
                      {canChange && !u.declared ? (
                        <UsedByMode name={u.name} mode={u.mode} replicas={u.replicas} />
                      ) : (
                        <>({modeWords[u.mode]})</>
                      )}
                    </>
                  )}
                  {replicaWords(u) ? <span className="muted"> · {replicaWords(u)}</span> : null}
                </li>
              ))}
            </ul>
          ) : null}
        </th>
        <td>
          <div className="states">
            {stateBadge(version.state)}
            {version.state === 'PRESENT' ? (
              <VerifiedBadge
                verified={version.verified}
                title={
                  version.verified
                    ? 'Every file hashes to its published sha256'
                    : 'Some file has no published sha256 to check it against'
                }
              />
            ) : null}
          </div>
        </td>
        <td className="progress-cell">
          <VersionProgress version={version} name={name} />
        </td>
        <td className="details">
          <VersionDetails version={version} />
        </td>
        <td className="actions">
          {canChange ? (
            <>
              {version.state === 'QUEUED' || version.state === 'FETCHING' ? (
                <button
                  type="button"
                  className="button small"
                  disabled={pauseState.fetching}
                  title="Stops the download and keeps what has arrived, to resume later"
                  onClick={onPause}
                >
                  Pause
                </button>
              ) : null}
              {version.state === 'PAUSED' ? (
                <button
                  type="button"
                  className="button small primary"
                  disabled={resumeState.fetching}
                  title="Goes on from what has arrived"
                  onClick={onResume}
                >
                  Resume
                </button>
              ) : null}
              {arriving || version.state === 'PAUSED' ? (
                <button
                  type="button"
                  className="button small"
                  disabled={cancelState.fetching}
                  title="Stops the download and discards what has arrived"
                  onClick={onCancel}
                >
                  Cancel
                </button>
              ) : null}
              {version.state === 'PRESENT' && version.kind && !['MODEL', 'UNKNOWN'].includes(version.kind) ? (
                <NotAModel version={version} />
              ) : version.state === 'PRESENT' && onServingChange ? (
                <button
                  type="button"
                  className={`button small${serving ? '' : ' primary'}`}
                  aria-expanded={serving}
                  onClick={() => onServingChange(!serving, name)}
                >
                  Serve
                </button>
              ) : null}
              {retryable ? (
                <button type="button" className="button small" disabled={retryState.fetching} onClick={onRetry}>
                  Retry
                </button>
              ) : null}
              <ConfirmButton onClick={() => setConfirming(true)}>Remove</ConfirmButton>
            </>
          ) : null}
          <InlineProblem problem={problem} inline={false} />
        </td>
      </tr>
      {confirming ? (
        <tr className="confirm-row">
          <td colSpan={COLUMNS}>
            <RemoveVersion version={version} onClose={() => setConfirming(false)} />
          </td>
        </tr>
      ) : null}
      {serving && canChange && version.state === 'PRESENT' ? (
        <tr className="serve-row">
          <td colSpan={COLUMNS}>
            <ServeForm model={version.model} version={version.version} onClose={() => onServingChange?.(false, name)} />
          </td>
        </tr>
      ) : null}
      {open ? (
        <tr className="files-row" id={filesId}>
          <td colSpan={COLUMNS}>
            <VersionFiles files={version.files} label={`Files of ${name}`} />
          </td>
        </tr>
      ) : null}
    </>
  );
});

/**
 * A bar only when the server knows the total (it never invents a percentage); otherwise the bytes received so
 * far, a number that only goes up. A held version shows its size.
 */
function VersionProgress({ version, name }: { version: VersionRow_Version; name: string }) {
  const arriving = arrivingStates.includes(version.state);
  if (!arriving) {
    if (version.state === 'PRESENT') return <span className="size">{formatBytes(version.bytesDone)}</span>;
    return version.bytesDone > 0 ? (
      <span className="muted">{formatBytes(version.bytesDone)} kept</span>
    ) : (
      <span className="muted">—</span>
    );
  }
  if (version.percent == null || version.bytesTotal == null) {
    return (
      <span className="size" title="The upstream has not said how big the files are">
        {formatBytes(version.bytesDone)} <span className="muted">so far, size not known yet</span>
      </span>
    );
  }
  const text = `${version.percent.toFixed(1)} %: ${formatBytes(version.bytesDone)} of ${formatBytes(version.bytesTotal)}`;
  return (
    <div className="progress">
      <div
        className="bar"
        role="progressbar"
        aria-label={`${name} progress`}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={version.percent}
        aria-valuetext={text}
      >
        <div className="bar-fill" style={{ width: `${version.percent}%` }} />
      </div>
      <span className="progress-text">
        {version.percent.toFixed(1)} %{' '}
        <span className="muted">
          {formatBytes(version.bytesDone)} of {formatBytes(version.bytesTotal)}
        </span>
      </span>
    </div>
  );
}

/** What the operator needs next: the rate and time left, why it failed, or where nodes fetch it from. */
function VersionDetails({ version }: { version: VersionRow_Version }) {
  // A cancelled file's error is just "cancelled": the badge says so already.
  const error =
    version.error && version.state !== 'CANCELLED' ? <div className="form-error">{version.error}</div> : null;
  if (version.state === 'FAILED') return error;
  if (version.state === 'QUEUED') return <span className="muted">waiting for a download slot</span>;
  if (version.state === 'VERIFYING') {
    return (
      <>
        <span className="muted">checking the sha256</span>
        {error}
      </>
    );
  }
  if (version.state === 'PAUSED') return <span className="muted">paused: resume goes on from what arrived</span>;
  if (version.state === 'FETCHING') {
    return (
      <>
        {version.retry ? (
          <RetryLine retry={version.retry} />
        ) : version.bytesPerSecond == null ? (
          <span className="muted">starting…</span>
        ) : (
          <span className="nowrap">
            {formatRate(version.bytesPerSecond)}
            {version.etaSeconds != null ? (
              <span className="muted"> · about {formatDuration(version.etaSeconds)} left</span>
            ) : null}
          </span>
        )}
        {error}
      </>
    );
  }
  const url = servingUrl(version);
  if (url) {
    return (
      <span className="url-line">
        <code
          className="url"
          title="What a catalog entry (hangar.yaml's source) or a node fetches: this model's file, or its folder"
        >
          <BreakableUrl url={url} />
        </code>
        <CopyButton text={url} label="Copy URL" />
      </span>
    );
  }
  return null;
}

/**
 * The URL a catalog entry or a node should use for this version: llama.cpp loads a GGUF model from its file (a
 * split one from its first shard, which names the rest), so the folder's URL is offered only where the engine reads
 * a folder (safetensors, for vLLM) or the version holds no GGUF at all.
 */
export function servingUrl(version: Pick<VersionRow_Version, 'url' | 'files'>): string | null {
  // A projector beside the model (mmproj) is loaded with it, not in its place.
  const ggufs = version.files.filter((f) => /\.gguf$/i.test(f.file) && !/mmproj/i.test(f.file) && f.url);
  const first = ggufs.find((f) => /-0*1-of-\d+\.gguf$/i.test(f.file)) ?? (ggufs.length === 1 ? ggufs[0] : undefined);
  return first?.url ?? version.url ?? null;
}

/**
 * An upstream out of reach, said as it is: "retrying (attempt 3, next in 20 s): could not reach the upstream
 * (ECONNREFUSED)", counting down to the next try, with no rate or time left while nothing arrives.
 */
function RetryLine({ retry }: { retry: NonNullable<VersionRow_Version['retry']> }) {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, []);
  const seconds = (Date.parse(retry.nextAt) - now) / 1000;
  return (
    <span className="retrying" data-testid="retrying">
      retrying (attempt {retry.attempt}, {seconds >= 1 ? `next in ${formatDuration(seconds)}` : 'trying now'}):{' '}
      <span className="muted">{retry.reason}</span>
    </span>
  );
}
