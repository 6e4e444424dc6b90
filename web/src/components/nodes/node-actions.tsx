import { useState } from 'react';
import { useMutation } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { InlineConfirm } from '../common/confirm-dialog';
import { CopyButton } from '../common/copy-button';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { type NodeTable_Node, NodeTable_NodeFragment } from './node-table';

/** A node token with what its agent needs to start: shown once, after createNode or rotateNodeToken. */
export type AgentStart = ResultOf<typeof NodeActions_AgentStartFragment>;

/** What createNode and rotateNodeToken answer: the new token, how to start the agent with it, and the node. */
export const NodeActions_AgentStartFragment = graphql(
  `
  fragment NodeActions_AgentStart on CreatedNode {
    token
    agentCommand
    agentEnv {
      name
      value
    }
    node {
      ...NodeTable_Node
    }
  }
`,
  [NodeTable_NodeFragment],
);

export const NodeActions_RotateMutation = graphql(
  `
  mutation NodeActions_Rotate($name: String!) {
    rotateNodeToken(name: $name) {
      __typename
      ...NodeActions_AgentStart
      ...FormError_Refusal
    }
  }
`,
  [NodeActions_AgentStartFragment, FormError_RefusalFragment],
);

export const NodeActions_RevokeMutation = graphql(
  `
  mutation NodeActions_Revoke($name: String!) {
    revokeNodeToken(name: $name) {
      __typename
      ... on Node {
        ...NodeTable_Node
      }
      ...FormError_Refusal
    }
  }
`,
  [NodeTable_NodeFragment, FormError_RefusalFragment],
);

/** The node leaves the cached `nodes` list through graphcache's updater (graphql/cache.ts). */
export const NodeActions_RemoveMutation = graphql(
  `
  mutation NodeActions_Remove($name: String!, $force: Boolean) {
    removeNode(name: $name, force: $force) {
      __typename
      ... on RemovedNode {
        name
        message
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

/** The command that starts a node's agent, and its token, copyable; Hangar keeps only the token's hash. */
export function AgentStartPanel({
  nodeName,
  start,
  rotated,
  onDone,
}: {
  nodeName: string;
  start: AgentStart;
  rotated?: boolean;
  onDone: () => void;
}) {
  return (
    <div className="secret-once agent-start" role="status">
      <p>
        <strong>{rotated ? `A new token for “${nodeName}”.` : `Node “${nodeName}” added.`}</strong>{' '}
        {rotated ? 'The old token is refused from now: start the agent again with this one. ' : ''}
        The token is shown only once: Hangar keeps only its hash. Start the agent on the node, from a checkout of
        Hangar, with:
      </p>
      <div className="secret-row">
        <code data-testid="agent-command" className="secret">
          {start.agentCommand}
        </code>
        <CopyButton text={start.agentCommand} label="Copy command" />
      </div>
      <dl className="agent-env">
        {start.agentEnv.map((v) => (
          <div key={v.name}>
            <dt>
              <code>{v.name}</code>
            </dt>
            <dd>
              <code data-testid={v.name === 'HANGAR_NODE_TOKEN' ? 'node-token' : undefined} className="secret">
                {v.value}
              </code>
              {v.name === 'HANGAR_NODE_TOKEN' ? <CopyButton text={v.value} label="Copy token" /> : null}
            </dd>
          </div>
        ))}
      </dl>
      <p className="muted">
        Under a supervisor, run <code>node packages/agent/bin/hangar-agent.mjs</code> directly (pnpm does not pass
        SIGTERM on): on SIGTERM the agent tells Hangar it is leaving, and the node shows offline at once.
      </p>
      <button type="button" className="button small" onClick={onDone}>
        I have copied it
      </button>
    </div>
  );
}

type Step =
  | { kind: 'idle' }
  | { kind: 'confirm-rotate' }
  | { kind: 'confirm-revoke' }
  | { kind: 'confirm-remove' }
  | { kind: 'refused-remove'; refusal: Refusal };

/** What an action leaves for the page to show above the table: its row may be gone (removed) or too narrow. */
export type NodeNotice = { kind: 'rotated'; name: string; start: AgentStart } | { kind: 'said'; message: string };

/**
 * An admin's changes to one node: a new token (the old one refused at once), a revoked one, or the node removed.
 * Removing a node that runs something is refused with what it runs; "Remove anyway" then says what becomes of it.
 */
export function NodeActions({
  node,
  onNotice,
}: {
  node: Pick<NodeTable_Node, 'name' | 'tokenRevoked'>;
  onNotice: (notice: NodeNotice) => void;
}) {
  const [step, setStep] = useState<Step>({ kind: 'idle' });
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [rotate, doRotate] = useMutation(NodeActions_RotateMutation);
  const [revoke, doRevoke] = useMutation(NodeActions_RevokeMutation);
  const [remove, doRemove] = useMutation(NodeActions_RemoveMutation);
  const busy = rotate.fetching || revoke.fetching || remove.fetching;
  const keep = () => setStep({ kind: 'idle' });

  const onRotate = async () => {
    setRefusal(null);
    const outcome = (await doRotate({ name: node.name })).data?.rotateNodeToken;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome?.__typename === 'CreatedNode') {
      setStep({ kind: 'idle' });
      onNotice({ kind: 'rotated', name: node.name, start: outcome });
    }
  };
  const onRevoke = async () => {
    setRefusal(null);
    const outcome = (await doRevoke({ name: node.name })).data?.revokeNodeToken;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome) {
      setStep({ kind: 'idle' });
      onNotice({
        kind: 'said',
        message: `The token of ${node.name} is revoked: its agent is refused from now, and its replicas are placed on other nodes.`,
      });
    }
  };
  const onRemove = async (force: boolean) => {
    setRefusal(null);
    const outcome = (await doRemove({ name: node.name, force })).data?.removeNode;
    if (isRefusal(outcome)) {
      if (outcome.__typename === 'ConflictError' && !force) setStep({ kind: 'refused-remove', refusal: outcome });
      else setRefusal(outcome);
    } else if (outcome?.__typename === 'RemovedNode') onNotice({ kind: 'said', message: `${outcome.message}.` });
  };

  return (
    <div className="node-actions">
      <div className="node-buttons">
        {/* A revoked node has no token to lose: its new one is given at once. A working one is asked first,
            since rotating stops its agent until the new token is set there. */}
        <button
          type="button"
          className="button small"
          disabled={busy}
          onClick={node.tokenRevoked ? onRotate : () => setStep({ kind: 'confirm-rotate' })}
        >
          {node.tokenRevoked ? 'New token' : 'Rotate token'}
        </button>
        {node.tokenRevoked ? null : (
          <button
            type="button"
            className="button small"
            disabled={busy}
            onClick={() => setStep({ kind: 'confirm-revoke' })}
          >
            Revoke token
          </button>
        )}
        <button
          type="button"
          className="button small danger"
          disabled={busy}
          onClick={() => setStep({ kind: 'confirm-remove' })}
        >
          Remove
        </button>
      </div>
      {step.kind === 'confirm-rotate' ? (
        <InlineConfirm
          label={`Rotate the token of ${node.name}`}
          action={`Rotate the token of ${node.name}`}
          busy={busy}
          onConfirm={onRotate}
          onKeep={keep}
        >
          <p>
            The current token is refused at once: its agent goes offline until it is restarted with the new token, shown
            once on the next screen. Its replicas are placed elsewhere meanwhile.
          </p>
        </InlineConfirm>
      ) : null}
      {step.kind === 'confirm-revoke' ? (
        <InlineConfirm
          label={`Revoke the token of ${node.name}`}
          action={`Revoke the token of ${node.name}`}
          busy={busy}
          onConfirm={onRevoke}
          onKeep={keep}
        >
          <p>
            Its agent is refused from now and the node goes offline; its replicas are placed on other nodes. A new token
            (“New token”) lets it back.
          </p>
        </InlineConfirm>
      ) : null}
      {step.kind === 'confirm-remove' ? (
        <InlineConfirm
          label={`Remove ${node.name}`}
          action={`Remove ${node.name}`}
          busy={busy}
          onConfirm={() => onRemove(false)}
          onKeep={keep}
        >
          <p>The node leaves the fleet and its token is refused. An agent still running there must be stopped.</p>
        </InlineConfirm>
      ) : null}
      {step.kind === 'refused-remove' ? (
        <InlineConfirm
          label={`Remove ${node.name} anyway`}
          action="Remove anyway"
          busy={busy}
          onConfirm={() => onRemove(true)}
          onKeep={keep}
        >
          <p role="alert" className="form-error">
            {step.refusal.message}
          </p>
        </InlineConfirm>
      ) : null}
      <FormError refusal={refusal} error={rotate.error ?? revoke.error ?? remove.error} />
    </div>
  );
}
