import { useState } from 'react';
import { type Answer, graphql } from '../../graphql/graphql';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { FormPanel, LabelledControl, onFormSubmit, SubmitButton } from '../common/form-parts';
import { useRefusableMutation } from '../common/use-refusable-mutation';
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
  const { fetching, error, refusal, run } = useRefusableMutation(AddNodeForm_CreateMutation, (d) => d.createNode);
  const [created, setCreated] = useState<Created | null>(null);

  const submit = onFormSubmit(async (values, form) => {
    setCreated(null);
    const outcome = await run({ name: String(values.get('name') ?? '').trim() });
    if (outcome?.__typename === 'CreatedNode') {
      setCreated(outcome);
      form.reset();
    }
  });

  return (
    <FormPanel titleId="add-node-title" title="Add a node">
      {created ? (
        <AgentStartPanel nodeName={created.node.name} start={created} onDone={() => setCreated(null)} />
      ) : null}
      <form className="form-row" onSubmit={submit}>
        <LabelledControl label="Node name">
          <input name="name" required placeholder="gpu-01" autoComplete="off" />
        </LabelledControl>
        <SubmitButton busy={fetching}>Add node</SubmitButton>
      </form>
      <FormError refusal={refusal} error={error} />
    </FormPanel>
  );
}
