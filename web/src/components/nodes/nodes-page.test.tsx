import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { AddNodeForm_CreateMutation } from './add-node-form';
import { NodeActions_RemoveMutation, NodeActions_RotateMutation } from './node-actions';
import { NodesPage, NodesPage_NodesQuery } from './nodes-page';

const gpuNode = {
  __typename: 'Node',
  id: 'n1',
  name: 'gpu-01',
  online: true,
  lastSeenAt: new Date().toISOString(),
  leftAt: null,
  tokenRevoked: false,
  agentVersion: '0.1.0',
  diskFreeBytes: 512_000_000_000,
  gpus: [{ __typename: 'Gpu', index: 0, name: 'NVIDIA H200', totalMiB: 143_771, freeMiB: 100_000 }],
  engines: [{ __typename: 'EngineInfo', name: 'llama.cpp', version: 'b4567', build: 4567 }],
  replicas: [
    {
      __typename: 'Replica',
      id: 'r1',
      state: 'FAILED',
      message: 'llama-server exited with code 1',
      gpuIndex: null,
      smokeText: null,
      tokensPerSecond: null,
      timeToFirstTokenMs: null,
      endpoint: null,
      gpuLayers: null,
      totalLayers: null,
      vramUsedBytes: null,
      model: { __typename: 'Model', id: 'm1', name: 'qwen3-8b' },
    },
    {
      __typename: 'Replica',
      id: 'r2',
      state: 'READY',
      message: 'loaded with a 4096-token context',
      gpuIndex: null,
      smokeText: ' Hi',
      tokensPerSecond: 52,
      timeToFirstTokenMs: 95.2,
      endpoint: 'http://10.0.0.5:8080/v1',
      gpuLayers: 29,
      totalLayers: 29,
      vramUsedBytes: 1024 ** 3 * 5.5,
      model: { __typename: 'Model', id: 'm2', name: 'llama-3b' },
    },
  ],
};

describe('NodesPage', () => {
  it('lists nodes with their GPU memory, engines and disk', async () => {
    const fake = fakeClient([answer(NodesPage_NodesQuery, () => ({ nodes: [gpuNode] }))]);
    render(
      <Provider value={fake.client}>
        <NodesPage canAdd={false} />
      </Provider>,
    );
    const row = (await screen.findByRole('rowheader', { name: /gpu-01/ })).closest('tr') as HTMLElement;
    expect(within(row).getByText('online')).toHaveClass('badge', 'ok');
    const meter = within(row).getByRole('meter', { name: 'GPU 0 memory' });
    expect(meter).toHaveAttribute('value', String(143_771 - 100_000));
    expect(meter).toHaveAttribute('max', '143771');
    expect(within(row).getByText(/97\.7 GiB free/)).toBeInTheDocument();
    expect(within(row).getByText(/llama\.cpp b4567/)).toBeInTheDocument();
    expect(within(row).getByText('477 GiB')).toBeInTheDocument();
    const replicas = within(within(row).getByRole('list', { name: 'Replicas on gpu-01' })).getAllByRole('listitem');
    expect(replicas.map((r) => r.textContent)).toEqual([
      'qwen3-8b FAILED: llama-server exited with code 1',
      'llama-3b READY · 52.0 tok/s · first token 95 ms · 5.5 GiB on GPU · said "Hi": loaded with a 4096-token contexthttp://10.0.0.5:8080/v1',
    ]);
    expect(within(replicas[1] as HTMLElement).getByText('http://10.0.0.5:8080/v1')).toHaveClass('replica-endpoint');
    expect(screen.queryByRole('button', { name: 'Add node' })).toBeNull();
  });

  it('lets an admin add a node and shows its token once', async () => {
    const fake = fakeClient([
      answer(NodesPage_NodesQuery, () => ({ nodes: [] })),
      answer(AddNodeForm_CreateMutation, (v) => ({
        createNode: {
          __typename: 'CreatedNode',
          token: 'hgn_node_token_once',
          agentCommand: `HANGAR_URL=http://hangar.internal:4000 HANGAR_NODE_TOKEN=hgn_node_token_once node packages/agent/bin/hangar-agent.mjs`,
          agentEnv: [
            { __typename: 'AgentEnvVar', name: 'HANGAR_URL', value: 'http://hangar.internal:4000' },
            { __typename: 'AgentEnvVar', name: 'HANGAR_NODE_TOKEN', value: 'hgn_node_token_once' },
          ],
          node: {
            ...gpuNode,
            id: 'n2',
            name: v.name,
            online: false,
            lastSeenAt: null,
            gpus: [],
            engines: [],
            replicas: [],
          },
        },
      })),
    ]);
    render(
      <Provider value={fake.client}>
        <NodesPage canAdd />
      </Provider>,
    );
    const user = userEvent.setup();
    expect(await screen.findByText(/No nodes yet/)).toBeInTheDocument();

    await user.type(screen.getByLabelText('Node name'), 'gpu-02');
    await user.click(screen.getByRole('button', { name: 'Add node' }));

    expect(await screen.findByTestId('node-token')).toHaveTextContent('hgn_node_token_once');
    expect(screen.getByText(/shown only once/)).toBeInTheDocument();
    // The exact command, copyable: the operator pastes it on the node.
    expect(screen.getByTestId('agent-command')).toHaveTextContent(
      'HANGAR_URL=http://hangar.internal:4000 HANGAR_NODE_TOKEN=hgn_node_token_once node packages/agent/bin/hangar-agent.mjs',
    );
    expect(screen.getByRole('button', { name: 'Copy command' })).toBeInTheDocument();
    expect(screen.getByRole('button', { name: 'Copy token' })).toBeInTheDocument();
    expect(await screen.findByRole('rowheader', { name: /gpu-02/ })).toBeInTheDocument();
    expect(fake.sent(AddNodeForm_CreateMutation)[0]?.variables).toEqual({ name: 'gpu-02' });

    await user.click(screen.getByRole('button', { name: 'I have copied it' }));
    expect(screen.queryByTestId('node-token')).toBeNull();
  });

  it('shows which GPU a replica runs on, and a node whose agent said it stopped', async () => {
    const seen = new Date(Date.now() - 60_000).toISOString();
    const twoGpus = {
      ...gpuNode,
      online: false,
      lastSeenAt: seen,
      leftAt: new Date(Date.now() - 50_000).toISOString(),
      replicas: [{ ...gpuNode.replicas[1], id: 'r3', gpuIndex: 1, message: null, endpoint: null }],
    };
    const fake = fakeClient([answer(NodesPage_NodesQuery, () => ({ nodes: [twoGpus] }))]);
    render(
      <Provider value={fake.client}>
        <NodesPage canAdd={false} />
      </Provider>,
    );
    const row = (await screen.findByRole('rowheader', { name: /gpu-01/ })).closest('tr') as HTMLElement;
    expect(within(row).getByText('offline')).toHaveClass('badge', 'muted');
    expect(within(row).getByText(/its agent stopped/)).toBeInTheDocument();
    const [chip] = within(within(row).getByRole('list', { name: 'Replicas on gpu-01' })).getAllByRole('listitem');
    expect(chip?.textContent).toMatch(/^llama-3b READY on GPU 1 · 52\.0 tok\/s/);
    // Viewers and operators get no buttons that would change the fleet.
    expect(screen.queryByRole('button', { name: 'Remove' })).toBeNull();
  });

  it('lets an admin rotate a token, shown once with the command, and remove a node, forced after a refusal', async () => {
    let nodes = [gpuNode];
    const fake = fakeClient([
      answer(NodesPage_NodesQuery, () => ({ nodes })),
      answer(NodeActions_RotateMutation, () => ({
        rotateNodeToken: {
          __typename: 'CreatedNode',
          token: 'hgn_rotated',
          agentCommand:
            'HANGAR_URL=http://h:4000 HANGAR_NODE_TOKEN=hgn_rotated node packages/agent/bin/hangar-agent.mjs',
          agentEnv: [
            { __typename: 'AgentEnvVar', name: 'HANGAR_URL', value: 'http://h:4000' },
            { __typename: 'AgentEnvVar', name: 'HANGAR_NODE_TOKEN', value: 'hgn_rotated' },
          ],
          node: gpuNode,
        },
      })),
      answer(NodeActions_RemoveMutation, (v) => {
        if (!v.force)
          return {
            removeNode: {
              __typename: 'ConflictError',
              message: 'node gpu-01 still runs 1 replica (llama-3b): stop them first, or remove it with force',
              code: 'CONFLICT',
            },
          };
        nodes = [];
        return {
          removeNode: {
            __typename: 'RemovedNode',
            name: 'gpu-01',
            message: 'removed node gpu-01: 1 replica of llama-3b deleted, placed again on other nodes',
          },
        };
      }),
    ]);
    render(
      <Provider value={fake.client}>
        <NodesPage canAdd />
      </Provider>,
    );
    const user = userEvent.setup();
    const row = (await screen.findByRole('rowheader', { name: /gpu-01/ })).closest('tr') as HTMLElement;

    // Asked first, saying what follows; nothing is sent until it is confirmed.
    await user.click(within(row).getByRole('button', { name: 'Rotate token' }));
    expect(within(row).getByText(/The current token is refused at once/)).toBeInTheDocument();
    expect(fake.sent(NodeActions_RotateMutation)).toEqual([]);
    await user.click(within(row).getByRole('button', { name: 'Rotate the token of gpu-01' }));
    expect(await screen.findByTestId('agent-command')).toHaveTextContent('HANGAR_NODE_TOKEN=hgn_rotated');
    expect(screen.getByText(/The old token is refused from now/)).toBeInTheDocument();
    expect(fake.sent(NodeActions_RotateMutation)[0]?.variables).toEqual({ name: 'gpu-01' });
    await user.click(screen.getByRole('button', { name: 'I have copied it' }));

    await user.click(within(row).getByRole('button', { name: 'Remove' }));
    await user.click(within(row).getByRole('button', { name: 'Remove gpu-01' }));
    expect(await within(row).findByRole('alert')).toHaveTextContent('still runs 1 replica (llama-3b)');
    expect(screen.getByRole('rowheader', { name: /gpu-01/ })).toBeInTheDocument();
    await user.click(within(row).getByRole('button', { name: 'Remove anyway' }));
    expect(await screen.findByText(/removed node gpu-01: 1 replica of llama-3b deleted/)).toBeInTheDocument();
    expect(screen.queryByRole('rowheader', { name: /gpu-01/ })).toBeNull();
    expect(fake.sent(NodeActions_RemoveMutation).map((o) => o.variables)).toEqual([
      { name: 'gpu-01', force: false },
      { name: 'gpu-01', force: true },
    ]);
  });
});
