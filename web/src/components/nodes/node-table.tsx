import type { ReactNode } from 'react';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { formatBytes, formatMiB } from '../../lib/format';
import { DataTable } from '../common/data-table';
import { TimeAgo } from '../common/time-ago';
import { replicaClass, smokeWords } from '../models/model-card';

export type NodeTable_Node = ResultOf<typeof NodeTable_NodeFragment>;

export const NodeTable_NodeFragment = graphql(`
  fragment NodeTable_Node on Node {
    id
    name
    online
    lastSeenAt
    leftAt
    tokenRevoked
    agentVersion
    diskFreeBytes
    gpus {
      index
      name
      totalMiB
      freeMiB
    }
    engines {
      name
      version
      build
    }
    replicas {
      id
      state
      message
      gpuIndex
      smokeText
      tokensPerSecond
      timeToFirstTokenMs
      endpoint
      gpuLayers
      totalLayers
      vramUsedBytes
      model {
        id
        name
      }
    }
  }
`);

/**
 * One row per node. Its state and when it was last seen sit under its name rather than in columns of their own:
 * at 1280 px seven columns pushed the replica chips and the disk column behind the table's own scrollbar.
 */
export function NodeTable({
  nodes,
  actions,
}: {
  nodes: NodeTable_Node[];
  /** An admin's buttons for a node (node-actions.tsx); none for others. */
  actions?: (node: NodeTable_Node) => ReactNode;
}) {
  const sorted = [...nodes].sort((a, b) => a.name.localeCompare(b.name));
  return (
    <DataTable
      className="node-table"
      columns={['Node', 'GPUs', 'Engines', 'Replicas', { label: 'Disk free', className: 'num' }]}
    >
      <tbody>
        {sorted.map((n) => (
          <NodeRow key={n.id} node={n} actions={actions?.(n)} />
        ))}
      </tbody>
    </DataTable>
  );
}

function NodeRow({ node, actions }: { node: NodeTable_Node; actions?: ReactNode }) {
  // Its agent said it was stopping (or its token was revoked) after its last report: that is why it is offline.
  const left = Boolean(
    !node.online && node.leftAt && (!node.lastSeenAt || new Date(node.leftAt) >= new Date(node.lastSeenAt)),
  );
  return (
    <tr>
      <th scope="row" className="node-cell">
        <span className="node-name">{node.name}</span>
        <div className="node-state">
          {node.tokenRevoked ? (
            <span className="badge bad">token revoked</span>
          ) : (
            <span className={`badge ${node.online ? 'ok' : 'muted'}`}>{node.online ? 'online' : 'offline'}</span>
          )}{' '}
          <span className="sub-inline">
            {node.lastSeenAt ? (
              <>
                seen <TimeAgo at={node.lastSeenAt} />
              </>
            ) : (
              'never seen'
            )}
          </span>
        </div>
        {left && !node.tokenRevoked && node.leftAt ? (
          <div className="sub">
            its agent stopped <TimeAgo at={node.leftAt} />
          </div>
        ) : null}
        {node.agentVersion ? <div className="sub">agent {node.agentVersion}</div> : null}
        {actions}
      </th>
      <td data-label="GPUs">
        {node.gpus.length === 0 ? (
          <span className="muted">{node.lastSeenAt ? 'none reported' : '—'}</span>
        ) : (
          <ul className="gpus">
            {node.gpus.map((g) => (
              <li key={g.index}>
                <GpuMemory gpu={g} />
              </li>
            ))}
          </ul>
        )}
      </td>
      <td data-label="Engines">
        {node.engines.length === 0 ? (
          <span className="muted">—</span>
        ) : (
          <ul className="plain">
            {node.engines.map((e) => (
              <li key={e.name}>
                {e.name}
                {e.version ? ` ${e.version}` : ''}
                {e.build != null ? <span className="muted"> (build {e.build})</span> : null}
              </li>
            ))}
          </ul>
        )}
      </td>
      <td data-label="Replicas">
        {node.replicas.length === 0 ? (
          <span className="muted">none</span>
        ) : (
          <ul className="chips" aria-label={`Replicas on ${node.name}`}>
            {node.replicas.map((r) => {
              return (
                <li
                  key={r.id}
                  className={`chip replica ${replicaClass[r.state]}`}
                  title={r.endpoint ? `serves on ${r.endpoint}` : undefined}
                >
                  {r.model.name} {r.state}
                  {r.gpuIndex != null ? ` on GPU ${r.gpuIndex}` : ''}
                  {smokeWords(r)}
                  {r.message ? `: ${r.message}` : ''}
                  {r.endpoint ? <code className="sub replica-endpoint">{r.endpoint}</code> : null}
                </li>
              );
            })}
          </ul>
        )}
      </td>
      <td className="num" data-label="Disk free">
        {node.diskFreeBytes == null ? '—' : formatBytes(node.diskFreeBytes)}
      </td>
    </tr>
  );
}

function GpuMemory({ gpu }: { gpu: NodeTable_Node['gpus'][number] }) {
  const used = Math.max(0, gpu.totalMiB - gpu.freeMiB);
  const share = gpu.totalMiB > 0 ? used / gpu.totalMiB : 0;
  const label = `${formatMiB(used)} used, ${formatMiB(gpu.freeMiB)} free of ${formatMiB(gpu.totalMiB)}`;
  return (
    <div className="gpu">
      <span className="gpu-name">
        {gpu.index}: {gpu.name}
      </span>
      <meter
        className="memory"
        min={0}
        max={gpu.totalMiB || 1}
        value={used}
        high={(gpu.totalMiB || 1) * 0.9}
        aria-label={`GPU ${gpu.index} memory`}
        title={label}
      />
      <span className="gpu-free">
        {formatMiB(gpu.freeMiB)} free
        <span className="muted"> / {formatMiB(gpu.totalMiB)}</span>
      </span>
      <span className="visually-hidden">{`(${Math.round(share * 100)}% used)`}</span>
    </div>
  );
}
