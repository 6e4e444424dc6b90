import { useMemo, useState } from 'react';
import { useQuery } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { formatCount } from '../../lib/format';
import { DataTable } from '../common/data-table';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { FormPanel, LabelledControl, onFormSubmit, SubmitButton } from '../common/form-parts';
import { PageHeader } from '../common/page';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import { CostChart } from './cost-chart';

// The cost report (#28): what calls cost (each replica's GPU time at its node's price, divided among the requests it
// served by their tokens) and what idle replicas cost apart, over time and grouped as the admin asks; and the prices
// it is computed from, which an admin sets here.

export const CostPage_ReportQuery = graphql(`
  query CostPage_Report($from: DateTime!, $to: DateTime!, $by: [CostDimension!], $step: Int) {
    costReport(from: $from, to: $to, by: $by, step: $step) {
      __typename
      ... on CostReport {
        currency
        unpricedGpuHours
        total { requests promptTokens completionTokens cost idleCost totalCost perMillionTokens }
        lines { idle scopeLabel team model node requests promptTokens completionTokens cost idleCost totalCost perMillionTokens }
        points { at cost idleCost }
      }
      ... on Error { message }
    }
  }
`);

export const CostPage_PricesQuery = graphql(`
  query CostPage_Prices {
    prices { target name perGpuHour perMillionPromptTokens perMillionCompletionTokens declared currency }
  }
`);

export const CostPage_SetNodePriceMutation = graphql(
  `
  mutation CostPage_SetNodePrice($node: String!, $price: String) {
    setNodePrice(node: $node, perGpuHour: $price) { __typename ... on Price { name } ...FormError_Refusal }
  }
`,
  [FormError_RefusalFragment],
);

export const CostPage_SetGpuPriceMutation = graphql(
  `
  mutation CostPage_SetGpuPrice($gpu: String!, $price: String) {
    setGpuPrice(gpu: $gpu, perGpuHour: $price) { __typename ... on Price { name } ...FormError_Refusal }
  }
`,
  [FormError_RefusalFragment],
);

export const CostPage_SetModelPriceMutation = graphql(
  `
  mutation CostPage_SetModelPrice($model: String!, $prompt: String, $completion: String) {
    setModelPrice(model: $model, perMillionPromptTokens: $prompt, perMillionCompletionTokens: $completion) {
      __typename
      ... on Price { name }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

type Report = Extract<ResultOf<typeof CostPage_ReportQuery>['costReport'], { __typename: 'CostReport' }>;
type Line = Report['lines'][number];

const RANGES = {
  day: { label: 'Last 24 hours', ms: 24 * 3600_000, step: 60 },
  week: { label: 'Last 7 days', ms: 7 * 24 * 3600_000, step: 360 },
  month: { label: 'Last 30 days', ms: 30 * 24 * 3600_000, step: 1440 },
} as const;
type Range = keyof typeof RANGES;

const GROUPS = { MODEL: 'Model', TEAM: 'Team', SCOPE: 'Caller', NODE: 'Node' } as const;
type Group = keyof typeof GROUPS;

function groupOf(line: Line, by: Group): string {
  if (line.idle) return 'Idle GPU time';
  if (by === 'MODEL') return line.model ?? '';
  if (by === 'NODE') return line.node ?? '';
  if (by === 'TEAM') return line.team ?? 'No team';
  return line.scopeLabel ?? '';
}

export function CostPage({ admin }: { admin: boolean }) {
  const [range, setRange] = useState<Range>('day');
  const [by, setBy] = useState<Group>('MODEL');
  // The window is fixed when the range is chosen, so a re-render does not ask again for a moved "now".
  const variables = useMemo(() => {
    const to = new Date();
    return {
      from: new Date(to.getTime() - RANGES[range].ms).toISOString(),
      to: to.toISOString(),
      by: [by],
      step: RANGES[range].step,
    };
  }, [range, by]);
  const [{ data, fetching, error }] = useQuery({ query: CostPage_ReportQuery, variables, pause: !admin });
  const result = data?.costReport;
  const report = result?.__typename === 'CostReport' ? result : undefined;
  return (
    <section>
      <PageHeader title="Cost">
        What calls cost: each replica's GPU time at its node's price per GPU-hour, shared among the requests it served
        by their tokens. Time a replica held GPUs and served nobody is idle, shown apart.
      </PageHeader>
      {!admin ? (
        <p className="empty">The cost report and prices are for admins.</p>
      ) : (
        <>
          <div className="form-row cost-controls">
            <LabelledControl label="Range">
              <select value={range} onChange={(e) => setRange(e.target.value as Range)}>
                {Object.entries(RANGES).map(([k, r]) => (
                  <option key={k} value={k}>
                    {r.label}
                  </option>
                ))}
              </select>
            </LabelledControl>
            <LabelledControl label="Group by">
              <select value={by} onChange={(e) => setBy(e.target.value as Group)}>
                {Object.entries(GROUPS).map(([k, label]) => (
                  <option key={k} value={k}>
                    {label}
                  </option>
                ))}
              </select>
            </LabelledControl>
          </div>
          <FormError error={error} />
          {result && result.__typename !== 'CostReport' && 'message' in result ? (
            <p className="form-error">{result.message}</p>
          ) : null}
          {report ? <ReportView report={report} by={by} /> : fetching ? <p className="muted">Loading…</p> : null}
          <Prices />
        </>
      )}
    </section>
  );
}

function ReportView({ report, by }: { report: Report; by: Group }) {
  const t = report.total;
  const c = report.currency;
  return (
    <>
      <dl className="facts cost-totals" data-testid="cost-totals">
        <div>
          <dt>Calls</dt>
          <dd>
            {t.cost} {c}
          </dd>
        </div>
        <div>
          <dt>Idle</dt>
          <dd>
            {t.idleCost} {c}
          </dd>
        </div>
        <div>
          <dt>Total</dt>
          <dd>
            {t.totalCost} {c}
          </dd>
        </div>
        <div>
          <dt>Per million tokens</dt>
          <dd>{t.perMillionTokens ? `${t.perMillionTokens} ${c}` : '—'}</dd>
        </div>
      </dl>
      {report.unpricedGpuHours > 0 ? (
        <p className="hint warn" role="note">
          {report.unpricedGpuHours.toFixed(2)} GPU-hours ran on nodes with no price: they cost nothing here until a node
          or GPU price is set below.
        </p>
      ) : null}
      <CostChart points={report.points} currency={c} />
      {report.lines.length ? (
        <DataTable
          label="Cost by group"
          className="dense cost-table"
          columns={[GROUPS[by], 'Requests', 'Tokens', `Calls (${c})`, `Idle (${c})`, `Per 1M tokens (${c})`]}
        >
          <tbody>
            {report.lines.map((l) => (
              <tr key={`${l.idle}-${groupOf(l, by)}`} data-testid="cost-line">
                <th scope="row" className={l.idle ? 'muted' : undefined}>
                  {groupOf(l, by)}
                </th>
                <td>{formatCount(Number(l.requests))}</td>
                <td>{formatCount(Number(l.promptTokens) + Number(l.completionTokens))}</td>
                <td>{l.cost}</td>
                <td>{l.idleCost}</td>
                <td>{l.perMillionTokens ?? '—'}</td>
              </tr>
            ))}
          </tbody>
        </DataTable>
      ) : (
        <p className="empty">No calls and no GPU time in this range.</p>
      )}
    </>
  );
}

const TARGETS = { NODE: 'Node', GPU: 'GPU model', MODEL: 'Model (per million tokens)' } as const;
type Target = keyof typeof TARGETS;

function Prices() {
  const [{ data }, refetch] = useQuery({ query: CostPage_PricesQuery });
  const node = useRefusableMutation(CostPage_SetNodePriceMutation, (d) => d.setNodePrice);
  const gpu = useRefusableMutation(CostPage_SetGpuPriceMutation, (d) => d.setGpuPrice);
  const model = useRefusableMutation(CostPage_SetModelPriceMutation, (d) => d.setModelPrice);
  const [target, setTarget] = useState<Target>('NODE');
  const [done, setDone] = useState<string>();
  const active = target === 'NODE' ? node : target === 'GPU' ? gpu : model;
  const submit = onFormSubmit(async (values, form) => {
    setDone(undefined);
    for (const m of [node, gpu, model]) m.clearRefusal();
    const name = String(values.get('name') ?? '').trim();
    const text = (k: string) => String(values.get(k) ?? '').trim() || null;
    const outcome =
      target === 'NODE'
        ? await node.run({ node: name, price: text('perGpuHour') })
        : target === 'GPU'
          ? await gpu.run({ gpu: name, price: text('perGpuHour') })
          : await model.run({ model: name, prompt: text('prompt'), completion: text('completion') });
    if (outcome) {
      setDone(`Set the price of ${name}.`);
      form.reset();
      refetch({ requestPolicy: 'network-only' });
    }
  });
  const prices = data?.prices ?? [];
  return (
    <>
      <h2 className="cost-section">Prices</h2>
      {prices.length ? (
        <DataTable
          label="Prices"
          className="dense"
          columns={['For', 'Name', 'Per GPU-hour', 'Per 1M prompt', 'Per 1M completion']}
        >
          <tbody>
            {prices.map((p) => (
              <tr key={`${p.target}-${p.name}`} data-testid="price-row">
                <td>{TARGETS[p.target as Target]}</td>
                <th scope="row">
                  {p.name}
                  {p.declared ? (
                    <>
                      {' '}
                      <span className="badge muted" title="Declared in hangar.yaml: change it there">
                        hangar.yaml
                      </span>
                    </>
                  ) : null}
                </th>
                <td>{p.perGpuHour ? `${p.perGpuHour} ${p.currency}` : '—'}</td>
                <td>{p.perMillionPromptTokens ? `${p.perMillionPromptTokens} ${p.currency}` : '—'}</td>
                <td>{p.perMillionCompletionTokens ? `${p.perMillionCompletionTokens} ${p.currency}` : '—'}</td>
              </tr>
            ))}
          </tbody>
        </DataTable>
      ) : (
        <p className="empty">No prices yet: GPU time costs nothing until a node or GPU model has one.</p>
      )}
      <FormPanel titleId="set-price-title" title="Set a price">
        <form className="form-row" onSubmit={submit}>
          <LabelledControl label="For">
            <select value={target} onChange={(e) => setTarget(e.target.value as Target)}>
              {Object.entries(TARGETS).map(([k, label]) => (
                <option key={k} value={k}>
                  {label}
                </option>
              ))}
            </select>
          </LabelledControl>
          <LabelledControl label="Name">
            <input name="name" required autoComplete="off" placeholder={target === 'GPU' ? 'NVIDIA L4' : 'gpu-1'} />
          </LabelledControl>
          {target === 'MODEL' ? (
            <>
              <LabelledControl label="Per 1M prompt tokens">
                <input name="prompt" inputMode="decimal" autoComplete="off" />
              </LabelledControl>
              <LabelledControl label="Per 1M completion tokens">
                <input name="completion" inputMode="decimal" autoComplete="off" />
              </LabelledControl>
            </>
          ) : (
            <LabelledControl label="Per GPU-hour">
              <input name="perGpuHour" inputMode="decimal" autoComplete="off" placeholder="2.40" />
            </LabelledControl>
          )}
          <SubmitButton busy={active.fetching}>Set price</SubmitButton>
        </form>
        <p className="hint">
          A node's own price wins over its GPU model's. A model priced per million tokens costs that for its calls
          instead of its GPU time. An empty price removes it.
        </p>
        <FormError refusal={active.refusal} error={active.error} />
        {done ? (
          <p role="status" className="notice">
            {done}
          </p>
        ) : null}
      </FormPanel>
    </>
  );
}
