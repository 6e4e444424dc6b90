import { type FormEvent, useId, useState } from 'react';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { ModelMode } from '../../graphql/types';
import { formatBytes } from '../../lib/format';
import { ConfirmDialog } from '../common/confirm-dialog';
import { CopyButton } from '../common/copy-button';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { ConfirmButton, DangerButton } from '../common/form-parts';
import { PageLink } from '../common/page-link';
import { TimeAgo, useClockTick } from '../common/time-ago';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import { modeWords } from '../mirror/mirror-parts';
import { VERDICT_TEXT } from '../training/train-evaluation';
import { ModelLive } from './model-live';
import { ModelOwnerForm, ownerWords } from './model-owner';

export type ReplicaState = ModelCard_Replica['state'];

export type ModelCard_Replica = ModelCard_Model['replicas'][number];

export type ModelCard_Model = ResultOf<typeof ModelCard_ModelFragment>;

/** How the gateway picks a replica (setModelRouting), as the operator reads it on the card. */
const routingWords: Record<ModelCard_Model['routing'], { label: string; title: string }> = {
  PREFIX: {
    label: 'by prefix',
    title:
      "A conversation (its session key, or its prompt's start) goes to the replica that holds it cached, while that one has room",
  },
  SESSION: {
    label: 'by session',
    title: 'A session key (prompt_cache_key, x-session-id, user) pins a replica; other requests go to the least loaded',
  },
  LEAST_LOADED: { label: 'least loaded', title: 'Each request goes to the replica with the fewest in flight' },
};

/** The whole model: the list, and every mutation that returns it, select it, so each updates the card by id. */
export const ModelCard_ModelFragment = graphql(`
  fragment ModelCard_Model on Model {
    id
    name
    source
    engine
    contextSize
    memoryBytes
    measuredMemoryBytes
    memoryEstimateError
    parallel
    mode
    wantedReplicas
    minReplicas
    targetInFlight
    declared
    declaredIn {
      file
      key
    }
    modeMessage
    owner
    routing
    fallbacks
    awakeUntil
    adapters {
      id
      name
      source
      owner
      ownerName
      evaluation {
        verdict
        forgettingVerdict
        heldOut
      }
    }
    replicas {
      id
      state
      desired
      message
      smokeText
      tokensPerSecond
      timeToFirstTokenMs
      endpoint
      gpuLayers
      totalLayers
      vramUsedBytes
      memoryMeasured
      cards {
        index
        totalBytes
        heldBytes
      }
      updatedAt
      node {
        id
        name
      }
    }
  }
`);

export const ModelCard_SetModeMutation = graphql(
  `
  mutation ModelCard_SetMode($name: String!, $mode: ModelMode!, $replicas: Int, $parallel: Int) {
    setModelMode(name: $name, mode: $mode, replicas: $replicas, parallel: $parallel) {
      __typename
      ...ModelCard_Model
      ...FormError_Refusal
    }
  }
`,
  [ModelCard_ModelFragment, FormError_RefusalFragment],
);

export const ModelCard_WakeMutation = graphql(
  `
  mutation ModelCard_Wake($name: String!) {
    wakeModel(name: $name) {
      __typename
      ...ModelCard_Model
      ...FormError_Refusal
    }
  }
`,
  [ModelCard_ModelFragment, FormError_RefusalFragment],
);

/** graphcache's updater (graphql/cache.ts) drops the model from the list by name. */
export const ModelCard_RemoveMutation = graphql(
  `
  mutation ModelCard_Remove($name: String!) {
    removeModel(name: $name) {
      __typename
      ... on RemovedModel {
        name
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

export const replicaClass: Record<ReplicaState, string> = {
  PENDING: 'arriving',
  LOADING: 'arriving',
  READY: 'ok',
  FAILED: 'bad',
  STOPPED: 'muted',
  LOST: 'bad',
};

/**
 * An on-demand model's wake timer, while it runs: "awake until in 14 minutes". Nothing for a model that is
 * always on or stopped (a timer left from before the mode changed means nothing there), nor once it has run out,
 * nor while no replica of it is ready (waking, or failed to wake: the mode message and the replicas say which).
 */
export function AwakeUntil({
  mode,
  awakeUntil,
  ready,
}: {
  mode: ModelMode;
  awakeUntil: string | null;
  /** Whether a replica of it is READY: "awake" while it is still loading, or failed to, would not be true. */
  ready: boolean;
}) {
  useClockTick();
  if (mode !== 'ON_DEMAND' || !ready || !awakeUntil || new Date(awakeUntil).getTime() <= Date.now()) return null;
  return (
    <span className="muted" data-testid="awake-until">
      awake until <TimeAgo at={awakeUntil} />
    </span>
  );
}

/**
 * A replica in one line: "READY on gpu-1 · 41.5 tok/s", "PENDING: fits on no node: …", "LOST: node gpu-2 stopped
 * reporting". The server's message is shown word for word; the node is named unless the message already says
 * where (a pending replica has no node yet, a lost one's message names it).
 */
export function replicaText(r: ModelCard_Replica): string {
  const explained = r.message != null && (r.state === 'PENDING' || r.state === 'LOST');
  let text: string = r.state;
  if (r.node && !explained) text += ` on ${r.node.name}${cardWords(r)}`;
  text += smokeWords(r);
  if (r.message) text += `: ${r.message}`;
  return text;
}

/**
 * What the replica holds on which of its node's cards: " GPU 0: 7.9 GiB of 24 GiB"; split, " GPU 0: 15 GiB of
 * 24 GiB, GPU 1: 15 GiB of 24 GiB"; "(planned)" until its agent has measured it on the card, since until then it
 * is the estimate placement booked. Nothing on a node without a GPU.
 */
export function cardWords(r: Pick<ModelCard_Replica, 'cards' | 'memoryMeasured'>): string {
  if (!r.cards?.length) return '';
  const each = r.cards.map((c) => `GPU ${c.index}: ${formatBytes(c.heldBytes)} of ${formatBytes(c.totalBytes)}`);
  return ` ${each.join(', ')}${r.memoryMeasured ? '' : ' (planned)'}`;
}

/**
 * What the control plane's smoke test through the replica's endpoint measured, and what it holds on its GPU:
 * " · 41.5 tok/s · first token 120 ms · 2.8 GiB on GPU · said "Hello"". Empty until it is ready.
 */
export function smokeWords(
  r: Pick<
    ModelCard_Replica,
    'state' | 'tokensPerSecond' | 'timeToFirstTokenMs' | 'smokeText' | 'vramUsedBytes' | 'gpuLayers' | 'totalLayers'
  > &
    Partial<Pick<ModelCard_Replica, 'cards' | 'memoryMeasured'>>,
): string {
  if (r.state !== 'READY') return '';
  let text = '';
  if (r.tokensPerSecond != null) text += ` · ${r.tokensPerSecond.toFixed(1)} tok/s`;
  if (r.timeToFirstTokenMs != null) text += ` · first token ${Math.round(r.timeToFirstTokenMs)} ms`;
  // No layer on the card is a replica on the CPU: "0 B on GPU" would read as a broken measurement.
  if (r.gpuLayers === 0) text += ' · on the CPU';
  // Measured and placed on cards, the cards already say it (cardWords).
  else if (r.vramUsedBytes != null && !(r.memoryMeasured && r.cards?.length)) {
    const layers =
      r.gpuLayers != null && r.totalLayers != null && r.gpuLayers < r.totalLayers
        ? ` (${r.gpuLayers} of ${r.totalLayers} layers)`
        : '';
    text += ` · ${formatBytes(r.vramUsedBytes)} on GPU${layers}`;
  }
  if (r.smokeText != null) text += ` · said ${JSON.stringify(r.smokeText.trim())}`;
  return text;
}

/** The estimate's error in words: "+7% over the estimate", "12% under the estimate". */
export function estimateErrorWords(error: number): string {
  const pct = Math.round(Math.abs(error) * 100);
  if (pct === 0) return 'as estimated';
  return error > 0 ? `+${pct}% over the estimate` : `${pct}% under the estimate`;
}

export function ReplicaChip({ replica }: { replica: ModelCard_Replica }) {
  const title = [
    replica.desired === 'STOP' ? 'asked to stop' : null,
    replica.smokeText != null ? `smoke test answered "${replica.smokeText}"` : null,
    replica.endpoint ? `serves on ${replica.endpoint}` : null,
  ]
    .filter(Boolean)
    .join('; ');
  return (
    <li className={`chip replica ${replicaClass[replica.state]}`} title={title || undefined}>
      {replicaText(replica)}
    </li>
  );
}

const modes: ModelMode[] = ['ALWAYS', 'ON_DEMAND', 'STOPPED'];
const engineWords = { llamacpp: 'llama.cpp', vllm: 'vLLM' } as const;
/**
 * Where a declared model is changed, on the page and not only in a tooltip: "declared in /etc/hangar/hangar.yaml
 * at models.1: change models.1.mode there". Without the server's file (an older server), hangar.yaml in general.
 */
export const declaredHint = (name: string, at: ModelCard_Model['declaredIn'] = null) =>
  at
    ? `${name} is declared in ${at.file} at ${at.key}: change ${at.key}.mode (or its other keys) there; the file is read at every start.`
    : `${name} is declared in the server's hangar.yaml: change it there; it is read at every start.`;

/** A model's own page (its playground): /models/<name>. */
export const modelPath = (name: string) => `/models/${encodeURIComponent(name)}`;

/**
 * One catalog model: what it is, how it runs and where. Its mode changes in place (applied with a button); a
 * declared model's configuration lives in hangar.yaml, so it offers no changes and says where to make them.
 */

export function ModelCard({
  model,
  canChange,
  onModelPage = false,
  cost,
}: {
  model: ModelCard_Model;
  canChange: boolean;
  /** What its calls and idle replicas cost over the last 24 hours (admins only: governance's cost report). */
  cost?: string;
  /** On the model's own page the card does not link to it. */
  onModelPage?: boolean;
}) {
  const titleId = useId();
  const [confirming, setConfirming] = useState(false);
  const wake = useRefusableMutation(ModelCard_WakeMutation, (d) => d.wakeModel);
  const onWake = () => void wake.run({ name: model.name });

  return (
    <article className="panel model-card" aria-labelledby={titleId} data-testid={`model-${model.name}`}>
      <header className="model-head">
        <h2 id={titleId} className="model-name">
          {onModelPage ? (
            model.name
          ) : (
            <PageLink to={modelPath(model.name)} className="model-link">
              {model.name}
            </PageLink>
          )}
        </h2>
        <span className="badge muted">{engineWords[model.engine] ?? model.engine}</span>
        <span className="badge">{modeWords[model.mode]}</span>
        {model.declared ? (
          <span className="badge warn" title={declaredHint(model.name, model.declaredIn)}>
            declared
          </span>
        ) : null}
        <AwakeUntil
          mode={model.mode}
          awakeUntil={model.awakeUntil}
          ready={model.replicas.some((r) => r.state === 'READY')}
        />
        {onModelPage ? null : (
          <PageLink to={modelPath(model.name)} className="button small model-open">
            Playground
          </PageLink>
        )}
      </header>
      <p className="mode-message" data-testid="mode-message" aria-live="polite">
        {model.modeMessage}
      </p>
      {model.declared ? (
        <p className="hint declared-hint" data-testid="declared-in">
          {declaredHint(model.name, model.declaredIn)}
        </p>
      ) : null}
      <dl className="facts model-facts">
        <div className="grow">
          <dt>Source</dt>
          <dd className="url-line">
            <code className="url">{model.source}</code>
            <CopyButton text={model.source} label="Copy source" />
          </dd>
        </div>
        <div>
          <dt>Memory</dt>
          <dd>
            {model.memoryBytes == null ? '—' : `${formatBytes(model.memoryBytes)} estimated`}
            {model.measuredMemoryBytes != null ? (
              <div className="sub" data-testid="measured-memory">
                {formatBytes(model.measuredMemoryBytes)} measured
                {model.memoryEstimateError != null ? ` · ${estimateErrorWords(model.memoryEstimateError)}` : ''}
              </div>
            ) : null}
          </dd>
        </div>
        <div>
          <dt>Context</dt>
          <dd>{model.contextSize == null ? "model's own" : model.contextSize.toLocaleString('en')}</dd>
        </div>
        <div>
          <dt>Replicas</dt>
          <dd>{replicasWanted(model)}</dd>
        </div>
        <div>
          <dt>At once</dt>
          <dd>{model.parallel === 1 ? '1 request' : `${model.parallel} requests`} per replica</dd>
        </div>
        {cost ? (
          <div>
            <dt>Cost</dt>
            <dd data-testid="model-cost">{cost}</dd>
          </div>
        ) : null}
        <div>
          <dt>Owner</dt>
          <dd data-testid="model-owner" title="Who may call it at /v1: the callers its owner admits">
            {ownerWords(model.owner)}
          </dd>
        </div>
        <div>
          <dt>Routing</dt>
          <dd data-testid="model-routing" title={routingWords[model.routing].title}>
            {routingWords[model.routing].label}
            {model.fallbacks.length ? (
              <div className="sub" data-testid="model-fallbacks">
                then {model.fallbacks.join(', then ')}
              </div>
            ) : null}
          </dd>
        </div>
      </dl>
      {model.replicas.length ? (
        <ul className="chips" aria-label={`Replicas of ${model.name}`}>
          {model.replicas.map((r) => (
            <ReplicaChip key={r.id} replica={r} />
          ))}
        </ul>
      ) : (
        <p className="muted">No replicas.</p>
      )}
      <ModelLive name={model.name} ownOnly={!canChange} />
      {model.adapters.length ? (
        <ul className="chips" aria-label={`Adapters of ${model.name}`}>
          {model.adapters.map((a) => (
            <li key={a.id} className="chip" title={a.source}>
              {a.name} <span className="muted">· {a.ownerName ?? 'everyone'}</span>
              {/* How it compared with its base when trained (kept after its job is deleted). */}
              {a.evaluation ? (
                <span
                  className="muted"
                  title={`On ${a.evaluation.heldOut} held-out pairs: ${a.evaluation.verdict}; on general questions: ${a.evaluation.forgettingVerdict}`}
                >
                  {' '}
                  · against its base: {VERDICT_TEXT[a.evaluation.verdict]?.text ?? a.evaluation.verdict}
                  {a.evaluation.forgettingVerdict === 'WORSE' ? ', forgot general questions' : ''}
                </span>
              ) : null}
            </li>
          ))}
        </ul>
      ) : (
        <p className="muted">No adapters.</p>
      )}
      {canChange && !model.declared ? (
        <>
          <ModeForm key={`${model.mode}:${model.wantedReplicas}:${model.parallel}`} model={model} />
          <ModelOwnerForm model={model} />
        </>
      ) : null}
      {canChange ? (
        <div className="model-actions">
          {model.mode === 'ON_DEMAND' ? (
            <button type="button" className="button small" disabled={wake.fetching} onClick={onWake}>
              Wake
            </button>
          ) : null}
          {!model.declared ? <ConfirmButton onClick={() => setConfirming(true)}>Remove</ConfirmButton> : null}
        </div>
      ) : null}
      <FormError refusal={wake.refusal} error={wake.error} />
      {confirming ? <RemoveModel name={model.name} onClose={() => setConfirming(false)} /> : null}
    </article>
  );
}

/** Mode and replicas, applied together with the button: nothing changes on a mere selection. */
function ModeForm({ model }: { model: ModelCard_Model }) {
  const [mode, setMode] = useState<ModelMode>(model.mode);
  const [replicas, setReplicas] = useState(String(Math.max(1, model.wantedReplicas)));
  const [parallel, setParallel] = useState(String(model.parallel));
  const { fetching, error, refusal, run } = useRefusableMutation(ModelCard_SetModeMutation, (d) => d.setModelMode);
  const modeId = useId();
  const replicasId = useId();
  const parallelId = useId();

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const n = Number(replicas);
    const p = Number(parallel);
    await run({
      name: model.name,
      mode,
      replicas: mode === 'ALWAYS' && replicas.trim() !== '' && Number.isFinite(n) ? n : null,
      // Sent as typed, even out of range: the server's refusal says what is accepted.
      parallel: parallel.trim() !== '' && Number.isFinite(p) && p !== model.parallel ? p : null,
    });
  };

  return (
    <form className="mode-form" aria-label={`Mode of ${model.name}`} onSubmit={submit} noValidate>
      <div className="field">
        <label htmlFor={modeId}>Mode</label>
        <select id={modeId} value={mode} onChange={(e) => setMode(e.target.value as ModelMode)}>
          {modes.map((m) => (
            <option key={m} value={m}>
              {modeWords[m]}
            </option>
          ))}
        </select>
      </div>
      {mode === 'ALWAYS' ? (
        <div className="field">
          <label htmlFor={replicasId}>Replicas</label>
          <input
            id={replicasId}
            className="replicas-input"
            type="number"
            min={1}
            step={1}
            value={replicas}
            onChange={(e) => setReplicas(e.target.value)}
          />
        </div>
      ) : null}
      <div className="field">
        <label htmlFor={parallelId}>At once</label>
        <input
          id={parallelId}
          className="replicas-input"
          type="number"
          min={1}
          max={64}
          step={1}
          value={parallel}
          title="Requests one replica answers at once (1–64); more wait in its queue. Replicas started after take it."
          onChange={(e) => setParallel(e.target.value)}
        />
      </div>
      <button type="submit" className="button small" disabled={fetching}>
        Apply
      </button>
      <div className="mode-error">
        <FormError refusal={refusal} error={error} />
      </div>
    </form>
  );
}

function RemoveModel({ name, onClose }: { name: string; onClose: () => void }) {
  const { fetching, error, refusal, run } = useRefusableMutation(ModelCard_RemoveMutation, (d) => d.removeModel);

  return (
    <ConfirmDialog
      title={`Remove ${name} from the catalog?`}
      refusal={refusal}
      error={error}
      onClose={onClose}
      actions={
        <DangerButton busy={fetching} onClick={() => void run({ name })}>
          Remove {name}
        </DangerButton>
      }
    >
      Its nodes stop its replicas; its files stay in the mirror.
    </ConfirmDialog>
  );
}

/** An autoscaled model wants a range, not its most: "1–3, autoscaled" (the Autoscaling panel has the target). */
function replicasWanted(m: Pick<ModelCard_Model, 'mode' | 'wantedReplicas' | 'minReplicas' | 'targetInFlight'>) {
  if (m.mode === 'STOPPED') return 'none wanted';
  if (m.targetInFlight == null) return `${m.wantedReplicas} wanted`;
  return `${m.minReplicas}–${m.wantedReplicas}, autoscaled`;
}
