import { gql } from 'urql';
import type { Bytes } from '../../graphql/types';
import { formatBytes, formatMiB } from '../../lib/format';
import { TimeAgo } from '../common/time-ago';
import { type ModelCard_Replica, type ReplicaState, replicaClass, smokeWords } from '../models/model-card';

export type NodeTable_Node = {
  __typename?: 'Node';
  id: string;
  name: string;
  online: boolean;
  lastSeenAt: string | null;
  agentVersion: string | null;
  diskFreeBytes: Bytes | null;
  gpus: { index: number; name: string; totalMiB: number; freeMiB: number }[];
  engines: { name: string; version: string | null; build: number | null }[];
  replicas: ({
    id: string;
    state: ReplicaState;
    message: string | null;
    model: { id: string; name: string };
  } & Pick<
    ModelCard_Replica,
    'smokeText' | 'tokensPerSecond' | 'timeToFirstTokenMs' | 'endpoint' | 'gpuLayers' | 'totalLayers' | 'vramUsedBytes'
  >)[];
};

export const NodeTable_NodeFragment = gql<NodeTable_Node>`
  fragment NodeTable_Node on Node {
    id
    name
    online
    lastSeenAt
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
`;

export function NodeTable({ nodes }: { nodes: NodeTable_Node[] }) {
  const sorted = [...nodes].sort((a, b) => a.name.localeCompare(b.name));
  return (
    <div className="table-wrap">
      <table className="table">
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">State</th>
            <th scope="col">Last seen</th>
            <th scope="col">GPUs</th>
            <th scope="col">Engines</th>
            <th scope="col">Replicas</th>
            <th scope="col" className="num">
              Disk free
            </th>
          </tr>
        </thead>
        <tbody>
          {sorted.map((n) => (
            <NodeRow key={n.id} node={n} />
          ))}
        </tbody>
      </table>
    </div>
  );
}

function NodeRow({ node }: { node: NodeTable_Node }) {
  return (
    <tr>
      <th scope="row">
        {node.name}
        {node.agentVersion ? <div className="sub">agent {node.agentVersion}</div> : null}
      </th>
      <td>
        <span className={`badge ${node.online ? 'ok' : 'muted'}`}>{node.online ? 'online' : 'offline'}</span>
      </td>
      <td>
        <TimeAgo at={node.lastSeenAt} empty="never" />
      </td>
      <td>
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
      <td>
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
      <td>
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
                  {smokeWords(r)}
                  {r.message ? `: ${r.message}` : ''}
                  {r.endpoint ? <code className="sub replica-endpoint">{r.endpoint}</code> : null}
                </li>
              );
            })}
          </ul>
        )}
      </td>
      <td className="num">{node.diskFreeBytes == null ? '—' : formatBytes(node.diskFreeBytes)}</td>
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
