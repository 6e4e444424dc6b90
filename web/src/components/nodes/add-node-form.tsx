import { type FormEvent, useState } from 'react';
import { useMutation } from 'urql';
import { type Answer, graphql } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { AgentStartPanel, NodeActions_AgentStartFragment } from './node-actions';

type Created = Answer<typeof AddNodeForm_CreateMutation, 'createNode', 'CreatedNode'>;

/** The node joins the cached `nodes` list through graphcache's updater (graphql/cache.ts). */
export const AddNodeForm_CreateMutation = graphql(
  `
  mutation AddNodeForm_Create($name: String!) {
    createNode(name: $name) {
      __typename
      ...NodeActions_AgentStart
      ...FormError_Refusal
    }
  }
`,
  [NodeActions_AgentStartFragment, FormError_RefusalFragment],
);

export function AddNodeForm() {
  const [{ fetching, error }, create] = useMutation(AddNodeForm_CreateMutation);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [created, setCreated] = useState<Created | null>(null);

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const formElement = event.currentTarget;
    const name = String(new FormData(formElement).get('name') ?? '').trim();
    setRefusal(null);
    setCreated(null);
    const result = await create({ name });
    const outcome = result.data?.createNode;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome?.__typename === 'CreatedNode') {
      setCreated(outcome);
      formElement.reset();
    }
  };

  return (
    <section className="panel" aria-labelledby="add-node-title">
      <h2 id="add-node-title">Add a node</h2>
      {created ? (
        <AgentStartPanel nodeName={created.node.name} start={created} onDone={() => setCreated(null)} />
      ) : null}
      <form className="form-row" onSubmit={submit}>
        <label className="field">
          <span>Node name</span>
          <input name="name" required placeholder="gpu-01" autoComplete="off" />
        </label>
        <button type="submit" className="button primary" disabled={fetching}>
          Add node
        </button>
      </form>
      <FormError refusal={refusal} error={error} />
    </section>
  );
}
