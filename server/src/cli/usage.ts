import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { table } from './format.js';

// `hangar usage --by team --from 2026-12-01`: what calls did and cost, grouped by team, caller, model or node
// (costReport, ADMIN). Idle GPU time is its own line: the price of keeping models ready, which no caller spent.

const Cli_CostReportQuery = graphql(
  `query Cli_CostReport($from: DateTime!, $to: DateTime!, $by: [CostDimension!], $scope: String, $model: String) {
    costReport(from: $from, to: $to, by: $by, scope: $scope, model: $model) {
      __typename
      ... on Error { code message }
      ... on CostReport {
        from to currency unpricedGpuHours
        total { requests promptTokens completionTokens cost idleCost totalCost perMillionTokens }
        lines {
          idle scope scopeLabel team model node
          requests promptTokens completionTokens gpuHours cost idleCost totalCost perMillionTokens
        }
      }
    }
  }`,
);

type Report = Extract<ResultOf<typeof Cli_CostReportQuery>['costReport'], { __typename: 'CostReport' }>;

const BY = { team: 'TEAM', scope: 'SCOPE', caller: 'SCOPE', model: 'MODEL', node: 'NODE' } as const;
type By = (typeof BY)[keyof typeof BY];

/** "2026-12-01", "2026-12-01T12:00:00Z", or "now": a day alone is its start, in UTC. */
function date(flag: string, value: string): Date {
  const d = value === 'now' ? new Date() : new Date(/^\d{4}-\d{2}-\d{2}$/.test(value) ? `${value}T00:00:00Z` : value);
  if (Number.isNaN(d.getTime())) {
    throw new CliError(`--${flag}: a date (2026-12-01, 2026-12-01T12:00:00Z) or "now"; "${value}" is not`, EXIT.usage);
  }
  return d;
}

function dimensions(raw: string[]): By[] {
  return raw.flatMap((r) =>
    r.split(',').map((part) => {
      const by = BY[part.trim().toLowerCase() as keyof typeof BY];
      if (!by) throw new CliError(`--by: team, scope, model or node; "${part}" is not`, EXIT.usage);
      return by;
    }),
  );
}

export function render(r: Report, by: By[]): string {
  const tokens = (l: { promptTokens: number | bigint; completionTokens: number | bigint }) =>
    String(Number(l.promptTokens) + Number(l.completionTokens));
  const head = by.map((b) => (b === 'SCOPE' ? 'CALLER' : b));
  const rows = r.lines.map((l) => [
    ...by.map((b) => {
      if (b === 'MODEL') return l.model ?? '';
      if (b === 'NODE') return l.node ?? '';
      // Idle GPU time is nobody's calls: its own line.
      if (l.idle) return '(idle)';
      return (b === 'TEAM' ? l.team : l.scopeLabel) ?? '(no team)';
    }),
    String(l.requests),
    tokens(l),
    l.cost,
    l.idleCost,
    l.perMillionTokens ?? '-',
  ]);
  const t = r.total;
  rows.push([
    ...by.map((_, i) => (i === 0 ? 'TOTAL' : '')),
    String(t.requests),
    tokens(t),
    t.cost,
    t.idleCost,
    t.perMillionTokens ?? '-',
  ]);
  const lines = [
    `${r.from} to ${r.to}, in ${r.currency}`,
    table([...head, 'REQUESTS', 'TOKENS', 'COST', 'IDLE', 'PER 1M TOKENS'], rows),
  ];
  if (r.unpricedGpuHours > 0) {
    lines.push(
      `${r.unpricedGpuHours.toFixed(2)} GPU-hours ran on nodes with no price: set one with setNodePrice or setGpuPrice.`,
    );
  }
  return lines.join('\n');
}

export function usageCommand(program: Command, ctx: Ctx) {
  program
    .command('usage')
    .description(
      'what calls cost from a date, grouped by team, caller, model or node, with idle GPU time apart (ADMIN)',
    )
    .requiredOption('--from <date>', 'the first day (2026-12-01, UTC) or time')
    .option('--to <date>', 'the end (exclusive); now by default', 'now')
    .option('--by <what...>', 'team, scope (the caller), model, node; several with commas or repeated', ['model'])
    .option('--scope <scope>', 'only the calls of team:<org>/<team>, user:<email>, key:<token id>, …')
    .option('--model <name>', 'only the calls to one model')
    .action(async (o: { from: string; to: string; by: string[]; scope?: string; model?: string }, cmd: Command) => {
      const by = [...new Set(dimensions(o.by))];
      const c = await ctx.client();
      const r = orFail(
        (
          await c.request(Cli_CostReportQuery, {
            from: date('from', o.from).toISOString(),
            to: date('to', o.to).toISOString(),
            by,
            scope: o.scope ?? null,
            model: o.model ?? null,
          })
        ).costReport,
      ) as Report;
      ctx.out(cmd).result(render(r, by), r);
    });
}
