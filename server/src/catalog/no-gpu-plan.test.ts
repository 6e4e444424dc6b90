import fs from 'node:fs/promises';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';

// The first serve on a machine without a GPU: its agent reports none, and the plan must say so and how to go on
// (declare the GPU, or serve on the CPU), not "needs 514 MiB, 0 MiB free" as if a GPU were full.

let t: TestApp;
const gguf = new URL('../../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url);

beforeAll(async () => {
  t = await startTestApp();
  const base = await t.app.start();
  const operator = await t.token('OPERATOR', 'no-gpu-ops');
  const put = await fetch(`${base}/mirror/laptop-model/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${operator}` },
    body: new Uint8Array(await fs.readFile(gguf)),
  });
  expect(put.status).toBe(201);
});
afterAll(() => t.close());

it('says the node reported no GPU and how to declare one or serve on the CPU', async () => {
  const admin = await t.token('ADMIN', 'no-gpu-admin');
  const nodeToken = (
    await t.gql('mutation { createNode(name: "laptop") { ... on CreatedNode { token } } }', {}, { token: admin })
  ).data?.createNode.token;
  const reported = await t.gql(
    'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename } }',
    { i: { gpus: [], engines: [{ name: 'llama.cpp', version: 'b4748', build: 4748 }], diskFreeBytes: 10 ** 12 } },
    { token: nodeToken },
  );
  expect(reported.data?.reportNode.__typename).toBe('Node');
  const r = await t.gql(
    '{ servePlan(model: "laptop-model", version: "v1") { __typename ... on ServePlan { fitsOn { node fits reason } } ... on Error { message } } }',
    {},
    { token: admin },
  );
  const [fit] = r.data?.servePlan.fitsOn ?? [];
  expect(fit).toMatchObject({ node: 'laptop', fits: false });
  expect(fit.reason).toMatch(/^needs \d+ MiB, and laptop reported no GPU \(nvidia-smi found none/);
  expect(fit.reason).toContain('declare its GPU with HANGAR_AGENT_GPUS=');
  expect(fit.reason).toContain('or serve on the CPU');
  expect(fit.reason).toContain('HANGAR_AGENT_GPU=false');
});
