import { useId, useState } from 'react';
import { useQuery } from 'urql';
import { type Answer, graphql, type ResultOf } from '../../graphql/graphql';
import type { ModelMode } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { formatBytes } from '../../lib/format';
import { Field, SelectField } from '../common/field';
import { FormError, FormError_RefusalFragment, refusedField } from '../common/form-error';
import { onFormSubmit, SubmitButton } from '../common/form-parts';
import { PageLink } from '../common/page-link';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import { ModelCard_ModelFragment } from '../models/model-card';
import { modeWords } from './mirror-parts';
import { useMirrorListingUpdates } from './mirror-updates';

export type ServeForm_Plan = ResultOf<typeof ServeForm_PlanFragment>;

export const ServeForm_PlanFragment = graphql(`
  fragment ServeForm_Plan on ServePlan {
    name
    engine
    source
    architecture
    servable
    verdict
    context
    memoryBytes
    fitsOn {
      node
      fits
      reason
    }
  }
`);

/** What serving the version would mean, asked before anything is confirmed. */
export const ServeForm_PlanQuery = graphql(
  `
  query ServeForm_Plan($model: String!, $version: String!, $context: Int) {
    servePlan(model: $model, version: $version, context: $context) {
      __typename
      ...ServeForm_Plan
      ...FormError_Refusal
    }
  }
`,
  [ServeForm_PlanFragment, FormError_RefusalFragment],
);

type Placed = Answer<typeof ServeForm_ServeMutation, 'serveMirrorVersion', 'ServePlaced'>;

/** The new model joins the Models page's list through graphcache's updater (graphql/cache.ts). */
export const ServeForm_ServeMutation = graphql(
  `
  mutation ServeForm_Serve(
    $model: String!
    $version: String!
    $name: String
    $context: Int
    $mode: ModelMode
    $replicas: Int
  ) {
    serveMirrorVersion(
      model: $model
      version: $version
      name: $name
      context: $context
      mode: $mode
      replicas: $replicas
    ) {
      __typename
      ... on ServePlaced {
        message
        model {
          ...ModelCard_Model
        }
        plan {
          ...ServeForm_Plan
        }
      }
      ...FormError_Refusal
    }
  }
`,
  [ModelCard_ModelFragment, ServeForm_PlanFragment, FormError_RefusalFragment],
);

const engineWords = { llamacpp: 'llama.cpp', vllm: 'vLLM' } as const;
const fields = ['name', 'context', 'mode', 'replicas'] as const;
type ServeField = (typeof fields)[number];

/**
 * Serving a present version: the server's plan first (engine, architecture, verdict, memory at the context, which
 * nodes it fits on), then the catalog entry's name, context, mode and replicas, confirmed with one button. A new
 * context asks for the plan again. The answer stays beneath: "… is in the catalog: replicas are placed on the next
 * pass", or the refusal next to the field it names.
 */
export function ServeForm({ model, version, onClose }: { model: string; version: string; onClose: () => void }) {
  const [planContext, setPlanContext] = useState<number | null>(null);
  const [{ data, fetching, error }] = useQuery({
    query: ServeForm_PlanQuery,
    variables: { model, version, context: planContext },
    requestPolicy: 'network-only',
  });
  const result = data?.servePlan;
  const plan = result?.__typename === 'ServePlan' ? result : undefined;
  const titleId = useId();

  return (
    <section className="serve-form" aria-labelledby={titleId}>
      <div className="repo-head">
        <h3 id={titleId}>
          Serve {model}/{version}
        </h3>
        <button type="button" className="button small close" onClick={onClose}>
          Close
        </button>
      </div>
      {isRefusal(result) ? (
        <p role="alert" className="form-error">
          {result.message}
        </p>
      ) : null}
      <FormError error={error} />
      {!plan && fetching ? <p className="muted">Planning: reading the version's header and the fleet…</p> : null}
      {plan ? (
        <>
          <PlanFacts plan={plan} />
          <ServeFields
            // What the operator typed stays while the plan is asked again at a new context.
            key={plan.name}
            model={model}
            version={version}
            plan={plan}
            planning={fetching}
            onContext={setPlanContext}
          />
        </>
      ) : null}
    </section>
  );
}

function PlanFacts({ plan }: { plan: ServeForm_Plan }) {
  return (
    <dl className="facts plan" aria-label="The plan">
      <div>
        <dt>Engine</dt>
        <dd>{engineWords[plan.engine] ?? plan.engine}</dd>
      </div>
      <div>
        <dt>Architecture</dt>
        <dd>{plan.architecture ?? <span className="muted">not known</span>}</dd>
      </div>
      <div>
        <dt>Verdict</dt>
        <dd className={plan.servable === false ? 'bad' : undefined}>
          {plan.verdict ?? (plan.servable ? 'servable' : 'not judged')}
        </dd>
      </div>
      <div>
        <dt>Memory</dt>
        <dd>
          {plan.memoryBytes == null ? '—' : formatBytes(plan.memoryBytes)}
          {plan.context != null ? <span className="muted"> at {plan.context.toLocaleString('en')} tokens</span> : null}
        </dd>
      </div>
      <div className="grow">
        <dt>Fits on</dt>
        <dd>
          {plan.fitsOn.length ? (
            <ul className="chips" aria-label="Fits per node">
              {plan.fitsOn.map((f) => (
                <li key={f.node} className={`chip fit ${f.fits ? 'ok' : 'bad'}`} title={f.reason}>
                  {f.node}: {f.reason}
                </li>
              ))}
            </ul>
          ) : (
            <span className="muted">no node to place it on</span>
          )}
        </dd>
      </div>
    </dl>
  );
}

function ServeFields({
  model,
  version,
  plan,
  planning,
  onContext,
}: {
  model: string;
  version: string;
  plan: ServeForm_Plan;
  planning: boolean;
  onContext: (context: number | null) => void;
}) {
  const [name, setName] = useState(plan.name);
  const [context, setContext] = useState(plan.context == null ? '' : String(plan.context));
  const [mode, setMode] = useState<ModelMode>('ALWAYS');
  const [replicas, setReplicas] = useState('1');
  const { fetching, error, refusal, run } = useRefusableMutation(ServeForm_ServeMutation, (d) => d.serveMirrorVersion);
  const listing = useMirrorListingUpdates();
  const [placed, setPlaced] = useState<Placed>();

  const contextValue = context.trim() === '' ? null : Number(context);
  const submit = onFormSubmit(async () => {
    setPlaced(undefined);
    const outcome = await run({
      model,
      version,
      name: name.trim() || null,
      context: contextValue,
      mode,
      replicas: mode === 'ALWAYS' && replicas.trim() !== '' ? Number(replicas) : null,
    });
    if (outcome?.__typename === 'ServePlaced') {
      setPlaced(outcome);
      // The version's "used by" now names the new model.
      listing.reread(model, version);
    }
  });

  const field = refusedField(refusal);
  const atField = field && (fields as readonly string[]).includes(field) ? (field as ServeField) : undefined;
  const errorAt = (f: ServeField) => (atField === f ? refusal?.message : undefined);

  return (
    <form className="serve-fields-form" aria-label={`Serve ${model}/${version}`} onSubmit={submit} noValidate>
      <div className="serve-fields">
        <Field
          label="Name"
          value={name}
          spellCheck={false}
          error={errorAt('name')}
          onChange={(e) => setName(e.target.value)}
        />
        <Field
          label="Context"
          inputClassName="context-input"
          type="number"
          min={1}
          step={1}
          value={context}
          placeholder="model's own"
          error={errorAt('context')}
          onChange={(e) => setContext(e.target.value)}
        />
        <SelectField label="Mode" value={mode} onChange={(m) => setMode(m as ModelMode)} error={errorAt('mode')}>
          {(['ALWAYS', 'ON_DEMAND', 'STOPPED'] as const).map((m) => (
            <option key={m} value={m}>
              {modeWords[m]}
            </option>
          ))}
        </SelectField>
        {mode === 'ALWAYS' ? (
          <Field
            label="Replicas"
            inputClassName="replicas-input"
            type="number"
            min={1}
            step={1}
            value={replicas}
            error={errorAt('replicas')}
            onChange={(e) => setReplicas(e.target.value)}
          />
        ) : null}
      </div>
      <div className="confirm-actions">
        {contextValue !== plan.context && (contextValue == null || Number.isInteger(contextValue)) ? (
          <button type="button" className="button small" disabled={planning} onClick={() => onContext(contextValue)}>
            Plan at this context
          </button>
        ) : null}
        <SubmitButton busy={fetching}>Put into service</SubmitButton>
      </div>
      {placed ? (
        <p role="status" className="notice">
          {placed.message} <PageLink to="/models">See it on the Models page</PageLink>
        </p>
      ) : null}
      <FormError refusal={atField ? null : refusal} error={error} />
    </form>
  );
}
