import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT } from './exit-codes.js';
import { table } from './format.js';

// `hangar train show <id>`: a job and how its adapter compared with its base on held-out questions (#32), the
// same evaluation the job's page shows, for a terminal or a script (--json).

const Cli_TrainShowQuery = graphql(`
  query Cli_TrainShow($id: ID!) {
    trainJob(id: $id) {
      id name model state step steps loss message heldOut adapter
      evaluation {
        heldOut seed verdict forgettingVerdict
        metrics { set name base adapter difference low high }
        questions { set question reference baseAnswer adapterAnswer }
      }
    }
  }
`);

type Shown = NonNullable<ResultOf<typeof Cli_TrainShowQuery>['trainJob']>;

const f = (x: number) => (Math.abs(x) >= 100 ? x.toFixed(0) : x.toFixed(3));
const signed = (x: number) => (x >= 0 ? `+${f(x)}` : f(x));
const cut = (s: string, n = 40) => {
  const one = s.replace(/\s+/g, ' ').trim();
  return one.length > n ? `${one.slice(0, n - 1)}…` : one;
};

/** The evaluation as a person reads it: the verdicts, the measures with their intervals, the answers side by side. */
export function describeEvaluation(j: Shown): string {
  const lines = [
    `${j.name} (${j.id}) for ${j.model}: ${j.state.toLowerCase()}${j.steps ? `, step ${j.step} of ${j.steps}` : ''}${j.adapter ? `, published as ${j.adapter}` : ''}`,
  ];
  const e = j.evaluation;
  if (!e) {
    lines.push(
      j.state === 'DONE'
        ? "not evaluated against its base (see the job's events for why)"
        : `${j.heldOut} pairs held out; the adapter is evaluated against its base after training`,
    );
    return lines.join('\n');
  }
  lines.push(
    `held-out pairs (${e.heldOut}, seed ${e.seed}): ${e.verdict}    general questions (forgetting): ${e.forgettingVerdict}`,
    '',
    table(
      ['set', 'measure', 'base', 'adapter', 'difference', '95% CI'],
      e.metrics.map((m) => [
        m.set,
        m.name,
        f(m.base),
        f(m.adapter),
        signed(m.difference),
        `${signed(m.low)} to ${signed(m.high)}`,
      ]),
    ),
    '',
    table(
      ['set', 'question', 'reference', 'base answered', 'adapter answered'],
      e.questions.map((q) => [q.set, cut(q.question), cut(q.reference, 24), cut(q.baseAnswer), cut(q.adapterAnswer)]),
    ),
  );
  return lines.join('\n');
}

export function trainShowCommand(train: Command, ctx: Ctx) {
  train
    .command('show')
    .description('a job and how its adapter compared with its base on held-out questions')
    .argument('<id>')
    .action(async (id: string, _o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const job = (await c.request(Cli_TrainShowQuery, { id })).trainJob;
      if (!job) throw new CliError(`there is no training job ${id}: \`hangar train ls\` lists them`, EXIT.notFound);
      out.result(describeEvaluation(job), job);
    });
}
