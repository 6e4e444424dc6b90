import { type FormEvent, useState } from 'react';
import { gql, useMutation } from 'urql';
import type { Outcome, Refusal } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { type AgentStart, AgentStartPanel, NodeActions_AgentStartFragment } from './node-actions';
import type { NodeTable_Node } from './node-table';

type Created = { __typename: 'CreatedNode'; node: NodeTable_Node } & AgentStart;

/** The node joins the cached `nodes` list through graphcache's updater (graphql/cache.ts). */
export const AddNodeForm_CreateMutation = gql<{ createNode: Outcome<Created> }, { name: string }>`
  mutation AddNodeForm_Create($name: String!) {
    createNode(name: $name) {
      __typename
      ...NodeActions_AgentStart
      ...FormError_Refusal
    }
  }
  ${NodeActions_AgentStartFragment}
  ${FormError_RefusalFragment}
`;

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
