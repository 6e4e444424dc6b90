import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { table } from './format.js';

// `hangar prices ls|set`: what GPU time and tokens cost on this fleet, over setNodePrice, setGpuPrice and
// setModelPrice. A node's own price wins over its GPU model's; a model with a price per million tokens is charged
// by its tokens instead of its GPU time. Money is a decimal string in the site's currency (HANGAR_CURRENCY), sent
// as typed: the server validates it and says what it accepts.

const Cli_PricesQuery = graphql(
  `query Cli_Prices($target: PriceTarget) {
    prices(target: $target) { target name perGpuHour perMillionPromptTokens perMillionCompletionTokens declared currency }
  }`,
);
const Cli_SetNodePriceMutation = graphql(
  `mutation Cli_SetNodePrice($node: String!, $perGpuHour: String) {
    setNodePrice(node: $node, perGpuHour: $perGpuHour) { __typename ... on Error { code message } ... on Price { name } }
  }`,
);
const Cli_SetGpuPriceMutation = graphql(
  `mutation Cli_SetGpuPrice($gpu: String!, $perGpuHour: String) {
    setGpuPrice(gpu: $gpu, perGpuHour: $perGpuHour) { __typename ... on Error { code message } ... on Price { name } }
  }`,
);
const Cli_SetModelPriceMutation = graphql(
  `mutation Cli_SetModelPrice($model: String!, $prompt: String, $completion: String) {
    setModelPrice(model: $model, perMillionPromptTokens: $prompt, perMillionCompletionTokens: $completion) {
      __typename ... on Error { code message } ... on Price { name }
    }
  }`,
);

type Prices = ResultOf<typeof Cli_PricesQuery>['prices'];

const TARGETS = ['node', 'gpu', 'model'] as const;
type Target = (typeof TARGETS)[number];

function target(value: string): Target {
  const t = value.toLowerCase();
  if ((TARGETS as readonly string[]).includes(t)) return t as Target;
  throw new CliError(`the target is one of ${TARGETS.join(', ')}; "${value}" is not`, EXIT.usage);
}

function render(prices: Prices): string {
  if (!prices.length) {
    return 'No prices: `hangar prices set node NAME --per-gpu-hour 2.40` (or gpu, or model with --per-million-prompt/--per-million-completion) sets one.';
  }
  const rows = prices.map((p) => [
    p.target,
    p.name,
    p.perGpuHour ?? '-',
    p.perMillionPromptTokens ?? '-',
    p.perMillionCompletionTokens ?? '-',
    p.currency,
    p.declared ? 'hangar.yaml' : '',
  ]);
  return table(['TARGET', 'NAME', 'PER GPU-HOUR', 'PER 1M PROMPT', 'PER 1M COMPLETION', 'CURRENCY', 'DECLARED'], rows);
}

type SetOptions = { perGpuHour?: string; perMillionPrompt?: string; perMillionCompletion?: string; remove?: boolean };

export function pricesCommands(program: Command, ctx: Ctx) {
  const prices = program
    .command('prices')
    .description('prices per GPU-hour (a node, a GPU model) and per million tokens (a model), for cost and budgets');

  prices
    .command('ls')
    .description('the prices set (OPERATOR and above)')
    .option('--target <target>', 'only node, gpu or model prices')
    .action(async (o: { target?: string }, cmd: Command) => {
      const c = await ctx.client();
      const which = o.target ? (target(o.target).toUpperCase() as 'NODE' | 'GPU' | 'MODEL') : null;
      const r = await c.request(Cli_PricesQuery, { target: which });
      ctx.out(cmd).result(render(r.prices), r.prices);
    });

  prices
    .command('set')
    .description(
      "set a node's or a GPU model's price per GPU-hour, or a model's price per million tokens; --remove removes it (ADMIN)",
    )
    .argument('<target>', 'node, gpu or model')
    .argument('<name>', 'the node, the GPU model as agents report it (hangar nodes ls), or the model')
    .option('--per-gpu-hour <money>', 'node or gpu: a decimal in the site currency, e.g. 2.40')
    .option('--per-million-prompt <money>', 'model: a decimal in the site currency per million prompt tokens')
    .option('--per-million-completion <money>', 'model: a decimal in the site currency per million completion tokens')
    .option('--remove', 'remove the price (a node then costs its GPU model’s price; a model its GPU time)')
    .action(async (kind: string, name: string, o: SetOptions, cmd: Command) => {
      const t = target(kind);
      const perHour = t === 'node' || t === 'gpu';
      const given = perHour
        ? o.perGpuHour !== undefined
        : o.perMillionPrompt !== undefined || o.perMillionCompletion !== undefined;
      const misplaced = perHour
        ? o.perMillionPrompt !== undefined || o.perMillionCompletion !== undefined
        : o.perGpuHour !== undefined;
      if (misplaced) {
        throw new CliError(
          perHour
            ? `a ${t} is priced per GPU-hour: give --per-gpu-hour, not --per-million-*`
            : 'a model is priced per million tokens: give --per-million-prompt and --per-million-completion, not --per-gpu-hour',
          EXIT.usage,
        );
      }
      if (given === Boolean(o.remove)) {
        throw new CliError(
          `give ${perHour ? '--per-gpu-hour' : '--per-million-prompt and/or --per-million-completion'}, or --remove`,
          EXIT.usage,
        );
      }
      const c = await ctx.client();
      const out = ctx.out(cmd);
      const done = (r: unknown) =>
        out.result(o.remove ? `Removed the price of ${t} ${name}.` : `Set the price of ${t} ${name}.`, r);
      if (t === 'node') {
        const perGpuHour = o.remove ? null : (o.perGpuHour ?? null);
        const r = (await c.request(Cli_SetNodePriceMutation, { node: name, perGpuHour })).setNodePrice;
        return done(r ? orFail(r) : null);
      }
      if (t === 'gpu') {
        const perGpuHour = o.remove ? null : (o.perGpuHour ?? null);
        const r = (await c.request(Cli_SetGpuPriceMutation, { gpu: name, perGpuHour })).setGpuPrice;
        return done(r ? orFail(r) : null);
      }
      const r = (
        await c.request(Cli_SetModelPriceMutation, {
          model: name,
          prompt: o.remove ? null : (o.perMillionPrompt ?? null),
          completion: o.remove ? null : (o.perMillionCompletion ?? null),
        })
      ).setModelPrice;
      return done(r ? orFail(r) : null);
    });
}
