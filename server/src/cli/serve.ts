import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import type { Out } from './output.js';
import type { HangarClient } from './session.js';
import { follow } from './watch.js';

const JobFields = graphql(`
  fragment Cli_ServeJob on ServeJob {
    id repo quant onDemand state outcome: message createdAt finishedAt
    steps { id name state message startedAt finishedAt }
  }
`);
const Cli_ServeMutation = graphql(
  `mutation Cli_Serve($repo: String!, $quant: String, $file: String, $onDemand: Boolean) {
    serveFromRegistry(repo: $repo, quant: $quant, file: $file, onDemand: $onDemand) {
      __typename
      ... on Error { code message }
      ... on ServeJob { ...Cli_ServeJob }
    }
  }`,
  [JobFields],
);
const Cli_ServeJobQuery = graphql(`query Cli_ServeJob($id: ID!) { serveJob(id: $id) { ...Cli_ServeJob } }`, [
  JobFields,
]);
const Cli_ServeJobChangedSubscription = graphql(
  `subscription Cli_ServeJobChanged($id: ID!) { serveJobChanged(id: $id) { ...Cli_ServeJob } }`,
  [JobFields],
);

type Job = ResultOf<typeof JobFields>;
const ENDED = new Set(['DONE', 'FAILED', 'CANCELLED']);

export function serveCommands(program: Command, ctx: Ctx) {
  program
    .command('serve')
    .description('serve a Hub repository: registry → mirror → check → catalog → replica → smoke test')
    .argument('[repo]', 'OWNER/REPO on the Hub')
    .option(
      '--quant <quant>',
      'the file set to serve, by quantisation (default: the first of Q4_K_M, Q5_K_M, Q6_K, Q8_0, … that fits on a node)',
    )
    .option('--file <file>', 'or the set holding this file')
    .option('--on-demand', 'add it on demand: no replica starts until a request asks for it')
    .option('--watch <job>', 'follow a serve job already started, by its id')
    .option('--no-wait', 'start the job and return at once with its id')
    .action(async (repo: string | undefined, o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      let job: Job;
      if (o.watch) {
        const found = (await c.request(Cli_ServeJobQuery, { id: o.watch })).serveJob;
        if (!found) throw new CliError(`there is no serve job ${o.watch}`, EXIT.notFound, 'NOT_FOUND');
        job = found;
      } else {
        if (!repo) throw new CliError('give the repository to serve, as OWNER/REPO (or --watch JOB)', EXIT.usage);
        const r = orFail(
          (
            await c.request(Cli_ServeMutation, {
              repo,
              quant: o.file ? null : o.quant,
              file: o.file ?? null,
              onDemand: o.onDemand ?? null,
            })
          ).serveFromRegistry,
        );
        if (r.__typename !== 'ServeJob') throw new CliError(`unexpected answer ${r.__typename}`, EXIT.failed);
        job = r;
        out.note(`serve job ${job.id} started for ${job.repo}${job.quant ? ` (${job.quant})` : ''}`);
        if (!o.wait) {
          out.result(job.id, job);
          return;
        }
      }
      ctx.exit(await watchJob(c, out, job));
    });
}

/** Prints each step as it changes (a line per change, not a redraw: the log reads top to bottom afterwards). */
async function watchJob(c: HangarClient, out: Out, first: Job) {
  const seen = new Map<string, string>();
  let last = first;
  const show = (job: Job) => {
    last = job;
    if (out.json) {
      out.result('', job);
    } else {
      for (const s of job.steps) {
        const line = `${s.state.toLowerCase()}${s.message ? `: ${s.message}` : ''}`;
        if (seen.get(s.name) === line) continue;
        seen.set(s.name, line);
        out.result(`${s.name.padEnd(8)} ${line}`, s);
      }
    }
    return ENDED.has(job.state);
  };
  const outcome = await follow({
    first,
    events: (async function* () {
      for await (const e of c.subscribe(Cli_ServeJobChangedSubscription, { id: first.id })) yield e.serveJobChanged;
    })(),
    current: async () => (await c.request(Cli_ServeJobQuery, { id: first.id })).serveJob,
    show,
    onInterrupt: () =>
      out.note(
        `Stopped watching; the serve job goes on in the server. Watch it again: hangar serve --watch ${first.id}`,
      ),
  });
  if (outcome === 'interrupted') return EXIT.interrupted;
  if (last.state === 'DONE') {
    if (!out.json) out.note(`done${last.outcome ? `: ${last.outcome}` : ''}`);
    return EXIT.ok;
  }
  out.note(`serve job ${last.state.toLowerCase()}${last.outcome ? `: ${last.outcome}` : ''}`);
  return EXIT.failed;
}
