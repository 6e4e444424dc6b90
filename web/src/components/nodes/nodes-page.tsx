import { useEffect, useState } from 'react';
import { useQuery } from 'urql';
import { graphql } from '../../graphql/graphql';
import { FormError } from '../common/form-error';
import { PageHeader } from '../common/page';
import { AddNodeForm } from './add-node-form';
import { AgentStartPanel, NodeActions, type NodeNotice } from './node-actions';
import { NodeTable, NodeTable_NodeFragment } from './node-table';

export const NodesPage_NodesQuery = graphql(
  `
  query NodesPage_Nodes {
    nodes {
      ...NodeTable_Node
    }
  }
`,
  [NodeTable_NodeFragment],
);

/** Agents report every few seconds; the list is re-read on this period so "online" and free memory stay true. */
const REFRESH_MS = 15_000;

export function NodesPage({ canAdd }: { canAdd: boolean }) {
  const [{ data, fetching, error }, refetch] = useQuery({ query: NodesPage_NodesQuery });
  const [notice, setNotice] = useState<NodeNotice | null>(null);
  useEffect(() => {
    const t = setInterval(() => {
      if (document.visibilityState === 'visible') refetch({ requestPolicy: 'network-only' });
    }, REFRESH_MS);
    return () => clearInterval(t);
  }, [refetch]);

  return (
    <section>
      <PageHeader title="Nodes">
        The GPU machines whose agents report to Hangar: whether they are online, their GPUs' memory, their engines and
        disk.
      </PageHeader>
      <FormError error={error} />
      {notice?.kind === 'rotated' ? (
        <AgentStartPanel nodeName={notice.name} start={notice.start} rotated onDone={() => setNotice(null)} />
      ) : notice ? (
        <p role="status" className="notice">
          {notice.message}{' '}
          <button type="button" className="link-button" onClick={() => setNotice(null)}>
            Dismiss
          </button>
        </p>
      ) : null}
      {data ? (
        data.nodes.length === 0 ? (
          <p className="empty">
            No nodes yet.{' '}
            {canAdd
              ? 'Add one below, then start its agent with the token Hangar gives you.'
              : 'An admin adds them; each then runs the Hangar agent.'}
          </p>
        ) : (
          <NodeTable
            nodes={data.nodes}
            actions={canAdd ? (n) => <NodeActions node={n} onNotice={setNotice} /> : undefined}
          />
        )
      ) : fetching ? (
        <p className="muted">Loading…</p>
      ) : null}
      {canAdd ? <AddNodeForm /> : null}
    </section>
  );
}
