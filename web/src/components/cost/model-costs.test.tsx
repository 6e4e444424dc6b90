import { render, screen, within } from '@testing-library/react';
import { getOperationName, Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { ModelsPage, ModelsPage_ModelsQuery } from '../models/models-page';
import { ModelCosts_Query } from './model-costs';

// Cost per model on the Models page (#28): an admin's cards say what each model cost over the last day, idle apart,
// and per million tokens, from one cost report; nobody else's page asks for it (costReport is the admins').

function model(name: string) {
  return {
    __typename: 'Model',
    id: `m-${name}`,
    name,
    source: `http://hangar.test/mirror/${name}/Q4_K_M/`,
    engine: 'llamacpp',
    contextSize: 8192,
    memoryBytes: null,
    measuredMemoryBytes: null,
    memoryEstimateError: null,
    parallel: 1,
    mode: 'ALWAYS',
    wantedReplicas: 1,
    minReplicas: 1,
    targetInFlight: null,
    declared: false,
    declaredIn: null,
    modeMessage: 'always: the replicas it wants run',
    routing: 'PREFIX',
    fallbacks: [],
    owner: null,
    awakeUntil: null,
    adapters: [],
    replicas: [],
  };
}

/** Whether the page asked for the cost report (once or more: the cache may ask again). */
const asked = (fake: ReturnType<typeof fakeClient>) => [
  ...new Set(fake.operations.map((o) => getOperationName(o.query)).filter((n) => n === 'ModelCosts_Report')),
];

const report = () => ({
  costReport: {
    __typename: 'CostReport',
    currency: 'EUR',
    lines: [
      {
        __typename: 'CostLine',
        model: 'qwen3-8b',
        totalCost: '7.70',
        idleCost: '7.54',
        perMillionTokens: '17116.6667',
      },
    ],
  },
});

describe('cost on the Models page', () => {
  it("shows each model's cost over the last day to an admin, from one report", async () => {
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [model('qwen3-8b'), model('tiny')] })),
      answer(ModelCosts_Query, report),
    ]);
    render(
      <Provider value={fake.client}>
        <ModelsPage canChange admin />
      </Provider>,
    );
    const qwen = await screen.findByTestId('model-qwen3-8b');
    expect(await within(qwen).findByTestId('model-cost')).toHaveTextContent(
      '7.70 EUR in 24 h (idle 7.54) · 17116.6667 per 1M tokens',
    );
    // A model with no line (nothing ran, no price) shows no cost rather than a made-up zero.
    expect(within(await screen.findByTestId('model-tiny')).queryByTestId('model-cost')).toBeNull();
    expect(asked(fake)).toEqual(['ModelCosts_Report']);
  });

  it('is not asked for by an operator', async () => {
    const fake = fakeClient([
      answer(ModelsPage_ModelsQuery, () => ({ models: [model('qwen3-8b')] })),
      answer(ModelCosts_Query, report),
    ]);
    render(
      <Provider value={fake.client}>
        <ModelsPage canChange />
      </Provider>,
    );
    const qwen = await screen.findByTestId('model-qwen3-8b');
    expect(within(qwen).queryByTestId('model-cost')).toBeNull();
    expect(asked(fake)).toEqual([]);
  });
});
