import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { GraphqlControlPlane } from '@hangar/agent/control-plane';
import { buildSchema, graphql } from 'graphql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// The agent's client against a control plane from before replicas reported their adapters: the schema this
// server prints with ReplicaReportInput.adapters taken out, executed by graphql-js over a real socket, so the
// refusal is graphql-js's own words for a field a schema lacks.

let server: http.Server;
let url: string;
const received: { query: string; variables: Record<string, unknown> }[] = [];

beforeAll(async () => {
  const printed = await fs.readFile(new URL('../schema.graphql', import.meta.url), 'utf8');
  const input = printed.match(/input ReplicaReportInput \{[^}]*\}/)?.[0];
  if (!input?.includes('adapters: [String!]')) throw new Error('schema.graphql has no ReplicaReportInput.adapters');
  const older = printed.replace(input, input.replace(/(\s*"""[^"]*"""\s*)?\n\s*adapters: \[String!\]\n/, '\n'));
  const schema = buildSchema(older);
  const rootValue = { reportReplica: () => ({ __typename: 'Replica', id: 'r' }) };
  server = http.createServer(async (req, res) => {
    let body = '';
    for await (const chunk of req) body += chunk;
    const { query, variables } = JSON.parse(body);
    received.push({ query, variables });
    const result = await graphql({ schema, source: query, variableValues: variables, rootValue });
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(result));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((resolve) => server.close(resolve));
});

describe('GraphqlControlPlane against an older control plane', () => {
  it('sends the report again without adapters when the server has no such field, and then never sends them', async () => {
    const agent = new GraphqlControlPlane(url, 'hgn_token');
    await agent.reportReplica({ replicaId: 'r', state: 'READY', adapters: ['tiny-a'] });
    expect(received).toHaveLength(2);
    expect(received[0]?.variables.adapters).toEqual(['tiny-a']);
    expect(received[1]?.query).not.toContain('adapters');
    expect(received[1]?.variables).toMatchObject({ replicaId: 'r', state: 'READY' });

    await agent.reportReplica({ replicaId: 'r', state: 'STOPPED', adapters: [] });
    expect(received).toHaveLength(3);
    expect(received[2]?.query).not.toContain('adapters');
  });
});
