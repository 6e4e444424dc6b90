import { type FormEvent, useId, useState } from 'react';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { TimeAgo } from '../common/time-ago';
import { useRefusableMutation } from '../common/use-refusable-mutation';

// A model's autoscaling on its page: the bounds and the target it keeps, a form to set them (operators), and the
// autoscaler's recent decisions with the reason each was taken, as the audit log has them: an operator who sees a
// third replica appear can read why ("3.4 in flight per replica for 60 s, target 2: 2 → 3").

export const ModelScaling_ModelFragment = graphql(`
  fragment ModelScaling_Model on Model {
    id
    name
    declared
    minReplicas
    maxReplicas
    targetInFlight
    scalingDecisions {
      at
      message
    }
  }
`);

export type ModelScaling_Model = ResultOf<typeof ModelScaling_ModelFragment>;

export const ModelScaling_SetMutation = graphql(
  `
  mutation ModelScaling_Set($name: String!, $minReplicas: Int!, $maxReplicas: Int!, $targetInFlight: Float!) {
    setModelScaling(name: $name, minReplicas: $minReplicas, maxReplicas: $maxReplicas, targetInFlight: $targetInFlight) {
      __typename
      ...ModelScaling_Model
      ...FormError_Refusal
    }
  }
`,
  [ModelScaling_ModelFragment, FormError_RefusalFragment],
);

/** The bounds and target in words: what the autoscaler does for this model now. */
export function scalingWords(m: Pick<ModelScaling_Model, 'minReplicas' | 'maxReplicas' | 'targetInFlight'>): string {
  if (m.targetInFlight == null)
    return 'Not autoscaled: it runs the fixed count its mode sets. Set a target to add and remove replicas with its load.';
  const low = m.minReplicas === 0 ? '0 (on demand: a request wakes it)' : String(m.minReplicas);
  return `Autoscaled between ${low} and ${m.maxReplicas} replicas, keeping about ${m.targetInFlight} request${m.targetInFlight === 1 ? '' : 's'} in flight per replica.`;
}

export function ModelScaling({ model, canChange }: { model: ModelScaling_Model; canChange: boolean }) {
  return (
    <section className="panel model-scaling" aria-label={`Autoscaling of ${model.name}`}>
      <h2 className="section-title">Autoscaling</h2>
      <p className="hint">{scalingWords(model)}</p>
      {canChange && !model.declared ? <ScalingForm model={model} /> : null}
      <h3>Recent scaling decisions</h3>
      {model.scalingDecisions.length ? (
        <ol className="scaling-decisions">
          {model.scalingDecisions.map((d) => (
            <li key={`${d.at}-${d.message}`}>
              <span className="muted">
                <TimeAgo at={d.at} />
              </span>{' '}
              <span className="decision">{d.message}</span>
            </li>
          ))}
        </ol>
      ) : (
        <p className="muted hint">No scaling decision yet.</p>
      )}
    </section>
  );
}

function ScalingForm({ model }: { model: ModelScaling_Model }) {
  const [min, setMin] = useState(String(model.minReplicas));
  const [max, setMax] = useState(String(Math.max(1, model.maxReplicas)));
  const [target, setTarget] = useState(model.targetInFlight == null ? '2' : String(model.targetInFlight));
  const { fetching, error, refusal, run } = useRefusableMutation(ModelScaling_SetMutation, (d) => d.setModelScaling);
  const minId = useId();
  const maxId = useId();
  const targetId = useId();

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    // Sent as typed, even out of range: the server's refusal names the field and says what is accepted.
    await run({ name: model.name, minReplicas: Number(min), maxReplicas: Number(max), targetInFlight: Number(target) });
  };

  return (
    <form className="mode-form" aria-label={`Autoscaling of ${model.name}`} onSubmit={submit} noValidate>
      <div className="field">
        <label htmlFor={minId}>Fewest</label>
        <input
          id={minId}
          className="replicas-input"
          type="number"
          min={0}
          step={1}
          value={min}
          title="The fewest replicas it runs; 0 is on demand (a request wakes it)"
          onChange={(e) => setMin(e.target.value)}
        />
      </div>
      <div className="field">
        <label htmlFor={maxId}>Most</label>
        <input
          id={maxId}
          className="replicas-input"
          type="number"
          min={1}
          step={1}
          value={max}
          onChange={(e) => setMax(e.target.value)}
        />
      </div>
      <div className="field">
        <label htmlFor={targetId}>In flight per replica</label>
        <input
          id={targetId}
          className="replicas-input"
          type="number"
          min={0.1}
          step={0.1}
          value={target}
          title="A replica is added while the requests in flight per replica stay above this for the scaling window, and one removed while they stay low enough"
          onChange={(e) => setTarget(e.target.value)}
        />
      </div>
      <button type="submit" className="button small" disabled={fetching}>
        Autoscale
      </button>
      <div className="mode-error">
        <FormError refusal={refusal} error={error} />
      </div>
    </form>
  );
}
