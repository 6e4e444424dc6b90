import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { table } from './format.js';

// `hangar limits ls|set|rm`: limits and budgets on a scope (key:<token id>, user:<email>, team:<org>/<team>,
// project:<org>/<team>/<project>, org:<org>), for every model or one. `set` replaces what the scope had for that
// model, as setLimit does: a script that sets what it wants gets exactly that.

const Cli_LimitsQuery = graphql(
  `query Cli_Limits($scope: String) {
    limits(scope: $scope) {
      __typename
      ... on Error { code message }
      ... on QueryLimitsSuccess { data { id scope model declared refused usage { kind limit used remaining resetAt } } }
    }
  }`,
);
const Cli_SetLimitMutation = graphql(
  `mutation Cli_SetLimit($scope: String!, $model: String, $limit: LimitInput!) {
    setLimit(scope: $scope, model: $model, limit: $limit) { __typename ... on Error { code message } ... on Limit { id scope model } }
  }`,
);
const Cli_RemoveLimitMutation = graphql(
  `mutation Cli_RemoveLimit($scope: String!, $model: String) {
    removeLimit(scope: $scope, model: $model) { __typename ... on Error { code message } ... on Limit { id scope model } }
  }`,
);

type Limits = Extract<ResultOf<typeof Cli_LimitsQuery>['limits'], { __typename: 'QueryLimitsSuccess' }>['data'];

const KINDS = {
  rpm: 'requestsPerMinute',
  tpm: 'tokensPerMinute',
  concurrent: 'concurrentRequests',
  'tokens-per-day': 'tokensPerDay',
  'tokens-per-month': 'tokensPerMonth',
  'spend-per-month': 'spendPerMonth',
} as const;

function number(flag: string, value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0 || value.trim() === '') {
    throw new CliError(`--${flag}: a number of at least 0 (0 refuses every request); "${value}" is not`, EXIT.usage);
  }
  return n;
}

function render(limits: Limits): string {
  if (!limits.length) return 'No limits: `hangar limits set SCOPE --rpm N` sets one.';
  const rows = limits.flatMap((l) =>
    l.usage.map((u) => [
      l.scope,
      l.model ?? '*',
      u.kind,
      String(u.limit),
      String(u.used),
      String(u.remaining),
      u.resetAt ? String(u.resetAt) : '-',
      String(l.refused),
      l.declared ? 'hangar.yaml' : '',
    ]),
  );
  return table(['SCOPE', 'MODEL', 'KIND', 'LIMIT', 'USED', 'REMAINING', 'RESETS', 'REFUSED', 'DECLARED'], rows);
}

export function limitsCommands(program: Command, ctx: Ctx) {
  const limits = program
    .command('limits')
    .description('rate limits and budgets per key, user, team, project or org (the tightest that applies decides)');

  limits
    .command('ls')
    .description('the limits you may see, with what is used of each now (one scope with --scope)')
    .option(
      '--scope <scope>',
      'key:<token id>, user:<email>, team:<org>/<team>, project:<org>/<team>/<project>, org:<org>',
    )
    .action(async (o: { scope?: string }, cmd: Command) => {
      const c = await ctx.client();
      const r = orFail((await c.request(Cli_LimitsQuery, { scope: o.scope ?? null })).limits);
      const data = (r as { data: Limits }).data;
      ctx.out(cmd).result(render(data), data);
    });

  const set = limits
    .command('set')
    .description('set the limits of a scope, for every model or one (--model); replaces what it had there (ADMIN)')
    .argument('<scope>', 'key:<token id>, user:<email>, team:<org>/<team>, project:<org>/<team>/<project>, org:<org>')
    .option('--model <name>', 'one model or adapter; without it, every model');
  for (const flag of Object.keys(KINDS)) set.option(`--${flag} <n>`, KINDS[flag as keyof typeof KINDS]);
  set.action(async (scope: string, o: Record<string, string | undefined>, cmd: Command) => {
    const limit: Record<string, number> = {};
    for (const [flag, field] of Object.entries(KINDS)) {
      const key = flag.replace(/-([a-z])/g, (_m, ch: string) => ch.toUpperCase());
      const v = o[key];
      if (v !== undefined) limit[field] = number(flag, v);
    }
    if (!Object.keys(limit).length) {
      throw new CliError(
        `give at least one of ${Object.keys(KINDS)
          .map((k) => `--${k}`)
          .join(', ')}`,
        EXIT.usage,
      );
    }
    const c = await ctx.client();
    const r = orFail((await c.request(Cli_SetLimitMutation, { scope, model: o.model ?? null, limit })).setLimit);
    ctx.out(cmd).result(`Set limits on ${scope}${o.model ? ` for ${o.model}` : ''}.`, r);
  });

  limits
    .command('rm')
    .description('remove the limits of a scope for every model, or for one (--model) (ADMIN)')
    .argument('<scope>')
    .option('--model <name>', 'the model or adapter whose limit goes')
    .action(async (scope: string, o: { model?: string }, cmd: Command) => {
      const c = await ctx.client();
      const r = orFail((await c.request(Cli_RemoveLimitMutation, { scope, model: o.model ?? null })).removeLimit);
      ctx.out(cmd).result(`Removed the limits on ${scope}${o.model ? ` for ${o.model}` : ''}.`, r);
    });
}
