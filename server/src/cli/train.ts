import fs from 'node:fs/promises';
import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { downloadVerified } from './files.js';
import { bytes, table } from './format.js';
import type { Out } from './output.js';
import { ProgressBar } from './progress.js';
import type { HangarClient } from './session.js';
import { trainShowCommand } from './train-show.js';
import { follow } from './watch.js';

const JobFields = graphql(`
  fragment Cli_TrainJob on TrainJob {
    id name model baseRepo state step steps progress loss outcome: message adapter createdAt updatedAt finishedAt
    node { name }
  }
`);
const Cli_TrainJobsQuery = graphql(
  // The default page (50): the query cost limit counts a page of 200 of these as too dear.
  `query Cli_TrainJobs($state: JobState) { trainJobs(state: $state) { edges { node { ...Cli_TrainJob } } } }`,
  [JobFields],
);
const Cli_TrainJobQuery = graphql(`query Cli_TrainJob($id: ID!) { trainJob(id: $id) { ...Cli_TrainJob } }`, [
  JobFields,
]);
const Cli_TrainCreateMutation = graphql(
  `mutation Cli_TrainCreate($input: CreateTrainJobInput!) {
    createTrainJob(input: $input) { __typename ... on Error { code message } ... on TrainJob { ...Cli_TrainJob } }
  }`,
  [JobFields],
);
const Cli_TrainPublishMutation = graphql(`
  mutation Cli_TrainPublish($id: ID!, $force: Boolean, $reason: String) {
    publishTrainJob(id: $id, force: $force, reason: $reason) {
      __typename
      ... on Error { code message }
      ... on TrainJobPublished { adapter model note liveWithoutRestart }
    }
  }
`);
const Cli_TrainJobChangedSubscription = graphql(
  `subscription Cli_TrainJobChanged($id: ID) { trainJobChanged(id: $id) { ...Cli_TrainJob } }`,
  [JobFields],
);

type Job = ResultOf<typeof JobFields>;
const ENDED = new Set(['DONE', 'FAILED', 'CANCELLED']);
const JOB_STATES = ['QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED'] as const;
const isJobState = (s: string): s is (typeof JOB_STATES)[number] => (JOB_STATES as readonly string[]).includes(s);
/** The example the help shows: settings the trainer takes (a test keeps it accepted by the server's rules). */
export const PARAMS_EXAMPLE = '{"epochs": 3, "lr": 0.0002}';
// createTrainJob takes pairs inline up to 1 MiB; a larger set goes through POST /api/train/data (the console).
const INLINE_DATA_LIMIT = 1 << 20;

/**
 * createTrainJob's evaluation fields from --eval-share, --eval-seed and --eval-data; unset ones are left to the
 * server (10 % held out, picked by the training seed). The share is written as people say it ("10%") or as the API
 * takes it (0.1): the server checks its range and names the field.
 */
async function evalOptions(o: { evalShare?: string; evalSeed?: string; evalData?: string }) {
  let evalShare: number | null = null;
  if (o.evalShare !== undefined) {
    const text = o.evalShare.trim();
    const n = Number(text.endsWith('%') ? text.slice(0, -1) : text);
    if (text === '' || text === '%' || !Number.isFinite(n))
      throw new CliError(`--eval-share is a share such as 10% or 0.1: ${o.evalShare} is not`, EXIT.usage);
    evalShare = text.endsWith('%') ? Math.round(n * 100) / 10_000 : n;
  }
  let evalSeed: number | null = null;
  if (o.evalSeed !== undefined) {
    evalSeed = Number(o.evalSeed);
    if (o.evalSeed.trim() === '' || !Number.isInteger(evalSeed))
      throw new CliError(`--eval-seed is a whole number, such as 42: ${o.evalSeed} is not`, EXIT.usage);
  }
  let evalData: string | null = null;
  if (o.evalData !== undefined) {
    try {
      evalData = await fs.readFile(o.evalData, 'utf8');
    } catch (err) {
      throw new CliError(`--eval-data ${o.evalData} could not be read: ${(err as Error).message}`, EXIT.usage);
    }
  }
  return { evalShare, evalSeed, evalData };
}

export function trainCommands(program: Command, ctx: Ctx) {
  const train = program.command('train').description('LoRA training jobs on the fleet');
  trainShowCommand(train, ctx);

  train
    .command('create')
    .description('queue a training job, then follow it (Ctrl-C leaves it running)')
    .requiredOption('--name <name>', 'the adapter to make')
    .requiredOption('--model <model>', 'the catalog model it is for')
    .requiredOption('--base-repo <repo>', "the base model's Hub repository (its safetensors)")
    .requiredOption('--node <node>', 'the node to train on')
    .requiredOption('--gpu-mib <mib>', 'GPU memory it may use, in MiB', (v) => Number(v))
    .requiredOption('--data <file>', 'the pairs, NDJSON of {"q","a"}')
    .option('--owner <owner>', 'who may call the adapter: org:, team:, project:, user: or key: (or --public)')
    .option('--public', 'every caller of the model may call the adapter')
    .option(
      '--params <json>',
      `training parameters as JSON, such as ${PARAMS_EXAMPLE} (a refusal lists every one the trainer takes)`,
    )
    .option(
      '--no-gguf',
      'make only the PEFT adapter, not the llama.cpp GGUF adapter beside it (made by default when llama.cpp serves the model)',
    )
    .option(
      '--eval-share <share>',
      'pairs held out of training to compare the adapter with its base: 10% or 0.1 (default), 0 to 50%; 0: none',
    )
    .option('--eval-seed <n>', 'the seed that picks the held-out pairs (default: the training seed)')
    .option('--eval-data <file>', 'evaluate on this NDJSON of {"q","a"} instead; every pair of --data is trained on')
    .option('--no-wait', 'queue the job and return at once with its id')
    .action(async (o, cmd: Command) => {
      const out = ctx.out(cmd);
      const evaluation = await evalOptions(o);
      let data: string;
      try {
        data = await fs.readFile(o.data, 'utf8');
      } catch (err) {
        throw new CliError(`--data ${o.data} could not be read: ${(err as Error).message}`, EXIT.usage);
      }
      if (Buffer.byteLength(data) > INLINE_DATA_LIMIT)
        throw new CliError(
          `--data is over 1 MiB: upload it in the console (it goes by POST /api/train/data)`,
          EXIT.usage,
        );
      let params: unknown = null;
      if (o.params) {
        try {
          params = JSON.parse(o.params);
        } catch {
          throw new CliError(`--params is JSON, such as '${PARAMS_EXAMPLE}': ${o.params} is not`, EXIT.usage);
        }
      }
      const c = await ctx.client();
      const job = orFail(
        (
          await c.request(Cli_TrainCreateMutation, {
            input: {
              name: o.name,
              model: o.model,
              baseRepo: o.baseRepo,
              node: o.node,
              gpuMiB: o.gpuMib,
              data,
              params,
              // Unset: the server's default (a GGUF adapter when llama.cpp serves the model).
              gguf: o.gguf === false ? false : null,
              owner: o.owner ?? null,
              public: o.public ?? null,
              ...evaluation,
            },
          })
        ).createTrainJob,
      );
      if (job.__typename !== 'TrainJob') throw new CliError(`unexpected answer ${job.__typename}`, EXIT.failed);
      out.note(`training job ${job.id} queued on ${job.node?.name ?? o.node}`);
      if (!o.wait) return out.result(job.id, job);
      ctx.exit(await watchTrain(c, out, job));
    });

  train
    .command('ls')
    .description('the newest 50 training jobs')
    .option('--state <state>', 'only jobs in this state (QUEUED, RUNNING, DONE, FAILED, CANCELLED)')
    .action(async (o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const wanted = o.state == null ? null : String(o.state).toUpperCase();
      if (wanted != null && !isJobState(wanted))
        throw new CliError(`--state is one of ${JOB_STATES.join(', ')}: "${o.state}" is not`, EXIT.usage);
      const state = wanted;
      const jobs = (await c.request(Cli_TrainJobsQuery, { state })).trainJobs.edges.map((e) => e.node);
      out.result(
        table(
          ['ID', 'NAME', 'MODEL', 'STATE', 'STEP', 'LOSS', 'NODE'],
          jobs.map((j) => [
            j.id,
            j.name,
            j.model,
            j.state.toLowerCase(),
            `${j.step}/${j.steps}`,
            j.loss?.toFixed(3),
            j.node?.name,
          ]),
        ),
        jobs,
      );
    });

  train
    .command('watch')
    .description('follow a training job until it ends')
    .argument('<id>')
    .action(async (id: string, _o, cmd: Command) => {
      const c = await ctx.client();
      const job = (await c.request(Cli_TrainJobQuery, { id })).trainJob;
      if (!job) throw new CliError(`there is no training job ${id}: \`hangar train ls\` lists them`, EXIT.notFound);
      ctx.exit(await watchTrain(c, ctx.out(cmd), job));
    });

  train
    .command('download')
    .description('download what a job made: the PEFT adapter (a .tar.gz) or the llama.cpp GGUF adapter')
    .argument('<id>')
    .option('--kind <kind>', 'peft or gguf', 'gguf')
    .option('--out <path>', 'a file, or a directory to put it in under the name the server gives', '.')
    .action(async (id: string, o, cmd: Command) => {
      const out = ctx.out(cmd);
      const kind = String(o.kind).toLowerCase();
      if (kind !== 'peft' && kind !== 'gguf')
        throw new CliError(`--kind is peft or gguf: "${o.kind}" is not`, EXIT.usage);
      if (!/^[0-9a-f-]{36}$/.test(id))
        throw new CliError(`${id} is not a job id: \`hangar train ls\` lists them`, EXIT.usage);
      const c = await ctx.client();
      const got = await downloadVerified(c, `/api/train/jobs/${id}/artifacts/${kind}`, o.out, `job ${id}'s ${kind}`);
      out.result(`${got.file}: ${bytes(got.bytes)}, sha256 ${got.sha256} (verified)`, got);
    });

  train
    .command('publish')
    .description("put a finished job's adapter in the mirror and the catalog")
    .argument('<id>')
    .option('--force', 'publish even though its evaluation is WORSE than its base (needs --reason)')
    .option('--reason <text>', 'why, kept in the audit log with the evaluation')
    .action(async (id: string, o: { force?: boolean; reason?: string }, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const r = orFail(
        (await c.request(Cli_TrainPublishMutation, { id, force: o.force ?? null, reason: o.reason ?? null }))
          .publishTrainJob,
      );
      if (r.__typename !== 'TrainJobPublished') throw new CliError(`unexpected answer ${r.__typename}`, EXIT.failed);
      out.result(`published ${r.adapter} for ${r.model}: ${r.note}`, r);
    });
}

async function watchTrain(c: HangarClient, out: Out, first: Job) {
  const bar = out.json ? undefined : new ProgressBar();
  let last = first;
  // Steps per second from the server's own timestamps of successive reports, so a late watch reads the same.
  let rate: number | null = null;
  const show = (j: Job) => {
    const dt = (Date.parse(j.updatedAt) - Date.parse(last.updatedAt)) / 1000;
    if (j.step > last.step && dt > 0) rate = (j.step - last.step) / dt;
    last = j;
    if (out.json) out.result('', j);
    else
      bar?.update({
        label: j.name,
        done: j.step,
        total: j.steps > 0 ? j.steps : null,
        unit: 'steps',
        rate,
        etaSeconds: rate && j.state === 'RUNNING' ? (j.steps - j.step) / rate : null,
        state: j.state,
        note: j.loss != null ? `loss ${j.loss.toFixed(3)}` : null,
      });
    return ENDED.has(j.state);
  };
  const outcome = await follow({
    first,
    events: (async function* () {
      for await (const e of c.subscribe(Cli_TrainJobChangedSubscription, { id: first.id })) yield e.trainJobChanged;
    })(),
    current: async () => (await c.request(Cli_TrainJobQuery, { id: first.id })).trainJob,
    show,
    onInterrupt: () => {
      bar?.stop();
      out.note(`Stopped watching; the job goes on in the server. Watch it again: hangar train watch ${first.id}`);
    },
  });
  bar?.stop();
  if (outcome === 'interrupted') return EXIT.interrupted;
  if (last.state === 'DONE') {
    if (!out.json) out.result(`${last.name} done: publish it with \`hangar train publish ${last.id}\``, last);
    return EXIT.ok;
  }
  out.note(`${last.name} ${last.state.toLowerCase()}${last.outcome ? `: ${last.outcome}` : ''}`);
  return EXIT.failed;
}
