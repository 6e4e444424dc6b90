import type { Actor } from '../auth/actor.js';
import type { CatalogService } from '../catalog/catalog.service.js';
import { modelByName } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import type { FleetService } from '../fleet/fleet.service.js';
import { replicasOfModel } from '../fleet/fleet-store.js';
import type { ServeJob } from '../generated/prisma/client.js';
import { formatBytes } from '../lib/units.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import type { RegistryService } from '../registry/registry.service.js';
import type { JudgedSet } from '../registry/types.js';

// The serve job's steps as data: each step's handler in one table, run in the order of STEPS (the order of its
// rows, by position). A step is written so that running it again after a restart does no harm: the runner
// (serve-job.service.ts) reruns the step it was on when the server stopped or the database went away.

export const STEPS = ['registry', 'mirror', 'check', 'catalog', 'replica', 'smoke'] as const;
export type Step = (typeof STEPS)[number];

/** What the steps found so far, kept with each step's row and merged in order, so a restart has it all. */
export type Detail = { set?: string; revision?: string; model?: string; version?: string; name?: string };

/** The step cannot succeed; the job ends FAILED with this message. */
export class StepFailed extends Error {}
/** Nothing more to do (an on-demand or parked model runs no replica): the job ends DONE with this message. */
export class StopEarly extends Error {}
/** The server is stopping: the job is left for the next start (or another replica) to pick up. */
export class Interrupted extends Error {}

export type StepDone = { message: string; more: Detail };

/** What a step may use: the services it drives, and the runner's hooks for progress and waiting. */
export type StepRun = {
  job: ServeJob;
  /** What the steps before this one found. */
  detail: Detail;
  db: Db;
  registry: RegistryService;
  mirror: MirrorService;
  catalog: CatalogService;
  /** Runs the smoke step's request through the replica's endpoint. */
  fleet?: Pick<FleetService, 'smokeReplica'>;
  /** The job's own changes (the fetch, the catalog entry) are audited as the job's, naming who started it. */
  asJob: Actor;
  /** Says how the step is getting on, in its row's message (bytes arrived, where the replica is). */
  progress(message: string): Promise<void>;
  /** Waits one poll; throws Interrupted when the server is stopping meanwhile. */
  pause(): Promise<void>;
};

const REPLICA_PATIENCE_MS = 15 * 60_000;
/** How long a replica may wait for a node with room before the job says so and stops. */
const UNPLACED_PATIENCE_MS = 5_000;

/** Finds the set asked for in the registry and says whether it can be served, before a byte is fetched. */
async function registryStep({ job, ...run }: StepRun): Promise<StepDone> {
  const opened = await run.registry.repo({ id: job.repo });
  if (!opened.ok) throw new StepFailed(opened.error.message);
  const repo = opened.value;
  if (repo.noAccess) throw new StepFailed(repo.noAccess);
  const models = repo.sets.filter((offered) => offered.kind === 'MODEL' && offered.format === 'GGUF');
  const picked = !job.file && !job.quant ? bestSet(models) : undefined;
  const set = job.file
    ? repo.sets.find((offered) => offered.files.some((file) => file.path === job.file))
    : job.quant
      ? models.find((offered) => offered.quant === job.quant)
      : picked?.set;
  if (!set) {
    const has = models
      .map((offered) =>
        offered.shardCount > 1
          ? `${offered.quant ?? offered.id} (${offered.shardCount} shards)`
          : (offered.quant ?? offered.id),
      )
      .join(', ');
    const asked = job.file ?? (job.quant ? `${job.quant} set` : 'GGUF model set llama.cpp can serve');
    throw new StepFailed(`${job.repo} has no ${asked}; it has ${has || 'no GGUF model sets'}`);
  }
  if (!set.verdict.servable) throw new StepFailed(`${set.id}: ${set.verdict.reason}`);
  return {
    message: `${picked ? `${picked.why}: ` : ''}${set.id}: ${set.files.length} file(s), ${formatBytes(set.totalBytes)} at ${repo.shortRevision}`,
    more: { set: set.id, revision: repo.revision, model: set.model, version: set.version, name: set.model },
  };
}

// The order people pick quantisations in when nothing is asked: Q4_K_M first (the usual balance of size and
// quality, and what Hub model cards recommend), then better ones by size, then smaller ones, the unquantised
// last. A set not named here comes after these, smallest first.
const PREFERRED_QUANTS = [
  'Q4_K_M',
  'Q5_K_M',
  'Q6_K',
  'Q8_0',
  'Q5_K_S',
  'Q4_K_S',
  'IQ4_XS',
  'IQ4_NL',
  'Q4_0',
  'Q5_0',
  'Q3_K_L',
  'Q3_K_M',
  'IQ3_M',
  'Q3_K_S',
  'Q2_K',
  'F16',
  'BF16',
  'F32',
];

type OfferedSet = JudgedSet;

/**
 * The set `hangar serve REPO` takes when no quantisation or file is named: the first servable one in the order
 * above that fits on an online node now (memory) and on the mirror's disk; failing that, the first servable one
 * (the check step then says where it would fit). Says why, so the job's log names what was chosen.
 */
export function bestSet(sets: OfferedSet[]): { set: OfferedSet; why: string } | undefined {
  const rank = (s: OfferedSet) => {
    const i = PREFERRED_QUANTS.indexOf((s.quant ?? '').toUpperCase());
    return i === -1 ? PREFERRED_QUANTS.length + s.totalBytes / 2 ** 50 : i;
  };
  const servable = sets.filter((s) => s.verdict.servable).sort((a, b) => rank(a) - rank(b));
  const fitting = servable.find((s) => s.fits.disk.fits && s.fits.nodes.some((n) => n.fits));
  if (fitting)
    return {
      set: fitting,
      why: `no quantisation asked: took ${fitting.quant ?? fitting.id}, the first by preference that fits on a node now`,
    };
  const first = servable[0];
  if (first)
    return {
      set: first,
      why: `no quantisation asked and none fits on a node now: took ${first.quant ?? first.id}, the first by preference`,
    };
  return undefined;
}

/** Mirrors the set (or takes the copy already mirrored) and waits until every file is present and verified. */
async function mirrorStep({ job, detail, ...run }: StepRun): Promise<StepDone> {
  const { model = '', version = '' } = detail;
  const existing = await run.mirror.version(model, version);
  if (!existing || existing.state === 'FAILED' || existing.state === 'CANCELLED') {
    const started = await run.registry.fetchSet(run.asJob, {
      repo: job.repo,
      revision: detail.revision,
      // registryStep resolved the repository's default branch to that commit.
      ref: 'HEAD',
      set: detail.set ?? '',
      model,
      version,
    });
    if (!started.ok) throw new StepFailed(started.error.message);
    if (existing && existing.state !== 'PRESENT') await run.mirror.retry(run.asJob, { model, version }).catch(() => {});
  }
  for (;;) {
    const mirrored = await run.mirror.version(model, version);
    if (!mirrored) throw new StepFailed(`${model}/${version} left the mirror while arriving`);
    if (mirrored.state === 'PRESENT') return { message: `${model}/${version} present and verified`, more: {} };
    if (mirrored.state === 'FAILED' || mirrored.state === 'CANCELLED')
      throw new StepFailed(
        mirrored.files.find((file) => file.error)?.error ?? `the fetch ended ${mirrored.state.toLowerCase()}`,
      );
    await run.progress(
      `${formatBytes(mirrored.progress.bytesDone)} of ${mirrored.progress.bytesTotal == null ? '?' : formatBytes(mirrored.progress.bytesTotal)}`,
    );
    await run.pause();
  }
}

/** What the model needs and where it fits now: said in the job, not a reason to stop (a node may join). */
async function checkStep({ detail, ...run }: StepRun): Promise<StepDone> {
  const plan = await run.catalog.plan({ model: detail.model ?? '', version: detail.version ?? '', name: detail.name });
  if (!plan.ok) throw new StepFailed(plan.error.message);
  if (plan.value.verdict && !plan.value.verdict.servable) throw new StepFailed(plan.value.verdict.reason);
  const gib = plan.value.memory ? (plan.value.memory.totalBytes / 2 ** 30).toFixed(1) : '?';
  const fits = plan.value.fitsOn.filter((fit) => fit.fits).map((fit) => fit.node);
  return {
    message: `${plan.value.architecture}: needs ${gib} GiB at ${plan.value.memory?.context} tokens; fits on ${fits.join(', ') || 'no node now'}`,
    more: {},
  };
}

/** Puts the mirrored version in the catalog under its name, once: a rerun finds the entry it made. */
async function catalogStep({ job, detail, ...run }: StepRun): Promise<StepDone> {
  const name = detail.name ?? detail.model ?? '';
  const existing = await run.catalog.get(name);
  if (existing) {
    // After a restart, this step may already have run: the entry it made is the one wanted.
    if (existing.source.includes(`/mirror/${detail.model}/${detail.version}/`))
      return { message: `${name} is in the catalog`, more: {} };
    throw new StepFailed(`the catalog already has a model named ${name} serving something else`);
  }
  const placed = await run.catalog.serveMirrorVersion(run.asJob, {
    model: detail.model ?? '',
    version: detail.version ?? '',
    name,
    mode: job.onDemand ? 'ON_DEMAND' : 'ALWAYS',
  });
  if (!placed.ok) throw new StepFailed(placed.error.message);
  return { message: placed.value.message, more: {} };
}

/** Waits for a replica to be ready; stops early (DONE) for an on-demand or parked model, which runs none. */
async function replicaStep({ job, detail, ...run }: StepRun): Promise<StepDone> {
  if (job.onDemand)
    throw new StopEarly(`${detail.name} is on demand: no replica runs until it is asked for (wakeModel)`);
  // Patience is measured on the monotonic clock: a jump of the wall clock must not fail the step early.
  const deadline = performance.now() + REPLICA_PATIENCE_MS;
  let unplacedSince: number | null = null;
  for (;;) {
    const model = await modelWithReplicas(run.db, detail.name ?? '');
    if (!model) throw new StepFailed(`${detail.name} left the catalog`);
    if (model.maxReplicas === 0) throw new StopEarly(`${detail.name} was stopped (parked): no replica will start`);
    const ready = model.replicas.find((replica) => replica.state === 'READY');
    if (ready) return { message: `ready on ${ready.node?.name}`, more: {} };
    const failed = model.replicas.find((replica) => replica.state === 'FAILED');
    if (failed)
      throw new StepFailed(
        `the replica failed on ${failed.node?.name ?? 'its node'}: ${failed.message ?? 'no reason given'}`,
      );
    const unplaced = model.replicas.find((replica) => replica.state === 'PENDING' && !replica.nodeId);
    if (unplaced) {
      unplacedSince ??= performance.now();
      if (performance.now() - unplacedSince > UNPLACED_PATIENCE_MS)
        throw new StepFailed(unplaced.message ?? 'no node can take it');
    } else unplacedSince = null;
    const waiting = model.replicas.find((replica) => replica.state === 'LOADING' || replica.state === 'PENDING');
    await run.progress(
      waiting
        ? `${waiting.state.toLowerCase()} on ${waiting.node?.name ?? '—'}${waiting.message ? `: ${waiting.message}` : ''}`
        : 'waiting for placement',
    );
    if (performance.now() > deadline) throw new StepFailed('no replica became ready in 15 minutes');
    await run.pause();
  }
}

/** One request through the ready replica's endpoint: the job is DONE only when the model it made answers. */
async function smokeStep({ detail, ...run }: StepRun): Promise<StepDone> {
  const model = await modelWithReplicas(run.db, detail.name ?? '');
  const ready = model?.replicas.find((replica) => replica.state === 'READY');
  if (!ready) throw new StepFailed(`${detail.name} has no ready replica any more`);
  if (!run.fleet) throw new StepFailed('this server cannot reach replicas');
  // A request of its own through the replica's endpoint with its engine key, as the gateway will send one:
  // the job ends DONE only when the model it made answers.
  const smoke = await run.fleet.smokeReplica(ready.id);
  if (!smoke.ok) throw new StepFailed(smoke.reason);
  return {
    message: `answered ${JSON.stringify(smoke.text)} at ${smoke.tokensPerSecond.toFixed(1)} tokens/s, first token in ${Math.round(smoke.timeToFirstTokenMs)} ms`,
    more: {},
  };
}

/** The model by name with its replicas (and their nodes), from their owners: the catalog and the fleet. */
async function modelWithReplicas(db: Db, name: string) {
  const model = await modelByName(db, name);
  return model ? { ...model, replicas: await replicasOfModel(db, model.id) } : null;
}

/** Each step's handler; the next step is the one after it in STEPS. */
export const STEP_HANDLERS: Record<Step, (run: StepRun) => Promise<StepDone>> = {
  registry: registryStep,
  mirror: mirrorStep,
  check: checkStep,
  catalog: catalogStep,
  replica: replicaStep,
  smoke: smokeStep,
};
