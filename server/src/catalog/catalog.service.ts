import fs from 'node:fs/promises';
import { knownTensorTypes, newestBuild } from '@hangar/common/gguf/catalog';
import { factsOf } from '@hangar/common/gguf/facts';
import { estimateMemory, type MemoryEstimate } from '@hangar/common/gguf/memory';
import { readGguf } from '@hangar/common/gguf/reader';
import { type Verdict, verdictFor } from '@hangar/common/gguf/verdict';
import type { Logger } from '@hangar/common/log';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import type { Viewer } from '../auth/viewer.js';
import type { Config } from '../config.js';
import { ConfigError } from '../config.js';
import type { Db } from '../db/client.js';
import type { FleetService } from '../fleet/fleet.service.js';
import { runningReplicas } from '../fleet/fleet-store.js';
import { freeMiB, nodeGpus, noGpuReason } from '../fleet/node-inventory.js';
import type { CatalogModel } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result, UpstreamError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { notAModel, versionArchitecture, versionKindOf } from '../mirror/kind.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { versionOwner } from '../mirror/owned.js';
import { modelName, versionName } from '../mirror/paths.js';
import { lockOrgTree, type OrgService, ownerKey, sees } from '../org/org.service.js';
import { notify } from '../pubsub.js';
import {
  catalogName,
  declaredFile,
  declaredMessage,
  modeInput,
  parallelInput,
  replicasInput,
} from './catalog-input.js';
import { type LastRequestDb, recordLastRequest } from './last-request.js';
import { modeOf, scaling } from './mode.js';
import { type ModelRoutingDeps, setFallbacks, setRouting } from './model-routing.js';
import { setScaling } from './model-scaling.js';
import { isNameClash, ServedNames } from './served-names.js';

// The catalog's rules: what a model may be served from, its mode, owner and hangar.yaml entries. Kept as one class
// a little over 400 lines: its methods share the declared-model map and the same check → write → audit → notify
// order; the mode words and the input rules are in mode.ts and catalog-input.ts, re-exported here so importers
// keep this path.
export { durationWords, type Mode, memoryEstimateError, modeMessage, modeOf } from './mode.js';

export type ServePlan = {
  name: string;
  engine: 'llamacpp' | 'vllm';
  source: string;
  architecture: string | null;
  verdict: Verdict | null;
  memory: MemoryEstimate | null;
  fitsOn: { node: string; fits: boolean; reason: string }[];
};

export type CatalogDeps = {
  db: Db;
  audit: AuditService;
  config: Config;
  mirror: MirrorService;
  fleet: FleetService;
  log: Logger;
  org: OrgService;
};

export class CatalogService {
  /** Where each declared model is in hangar.yaml (its entry's index under models), as read at start. */
  private declaredAt = new Map<string, number>();
  /** The one namespace of models and adapters (served-names.ts): publishing an adapter claims from it too. */
  readonly names: ServedNames;

  constructor(private readonly deps: CatalogDeps) {
    this.names = new ServedNames({ db: deps.db, owners: deps.org });
  }

  list() {
    return this.deps.db.catalogModel.findMany({ orderBy: { name: 'asc' }, include: { adapters: true } });
  }

  /**
   * A model by name as the actor may see it: one it may not call reads as none, in the same words, so changing a
   * team's model is refused to an outsider without confirming the name (org-owners.ts `sees`).
   */
  private async visibleModel(actor: Actor, name: string): Promise<CatalogModel | null> {
    const m = await this.deps.db.catalogModel.findUnique({ where: { name } });
    return m && sees(await this.deps.org.sightOf(actor.viewer), m.owner) ? m : null;
  }

  get(name: string) {
    return this.deps.db.catalogModel.findUnique({ where: { name }, include: { adapters: true } });
  }

  /**
   * What serving a mirrored version would mean, before anything is created: the engine from the files, the
   * memory from the file's own header at the chosen context, and the nodes it fits on and those it does not.
   */
  async plan(
    input: {
      model: string;
      version: string;
      name?: string | null;
      context?: number | null;
    },
    viewer?: Viewer,
  ): Promise<Result<ServePlan>> {
    const parsed = parseInput(
      z.object({
        model: modelName,
        version: versionName,
        name: catalogName.nullish(),
        context: z.number().int().min(256).max(4_194_304).nullish(),
      }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    // An owned adapter's version is planned only for those its owner admits; to others it reads as none, in the
    // same words (as GET /mirror/… and the mirror's listing). `viewer` absent: Hangar's own pass (a serve job).
    const sight = viewer ? await this.deps.org.sightOf(viewer) : null;
    const v = await this.deps.mirror.version(model, version);
    const owned = v && sight && !sight.admin ? await versionOwner(this.deps.db, model, version) : null;
    if (!v || (sight && owned && !sees(sight, owned.owner))) {
      return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
    }
    if (v.state !== 'PRESENT') {
      // A catalog entry pointing at a partial file is exactly what versioned paths exist to prevent.
      return fail(
        new ConflictError(
          `${model}/${version} is ${v.state.toLowerCase()}, not present: it can be served once every file is verified`,
        ),
      );
    }
    // What it holds, from the files' headers: only weights are served as a model. An adapter's version names the
    // models it belongs to, where it is called (it runs on their replicas).
    const known = await this.deps.mirror.withKinds(v);
    const kind = versionKindOf(known.files);
    const adapterOf = (await this.deps.mirror.usedBy(model, version)).flatMap((u) =>
      u.adapterOf && (!sight || u.owners.every((o) => sees(sight, o))) ? [u.adapterOf] : [],
    );
    const refusal = notAModel(kind, versionArchitecture(known.files), adapterOf);
    if (refusal) return fail(new ConflictError(`${model}/${version}: ${refusal}`));
    // The weights by their header, never by their name: "imatrix" in a file name as often means "quantised with
    // an importance matrix" as "is one". A file whose header could not be read is taken as weights, as before.
    const ggufs = known.files.filter(
      (f) => f.file.toLowerCase().endsWith('.gguf') && (f.kind === 'MODEL' || f.kind === 'OTHER' || f.kind === null),
    );
    const name = parsed.value.name ?? model;
    if (!ggufs.length) {
      const source = this.deps.mirror.versionUrl(model, version);
      return ok({ name, engine: 'vllm', source, architecture: null, verdict: null, memory: null, fitsOn: [] });
    }
    // The first shard carries the metadata, and is what llama.cpp is pointed at.
    const first = [...ggufs].sort((a, b) => a.file.localeCompare(b.file))[0] as (typeof ggufs)[number];
    // From the data dir or, on HANGAR_MIRROR_STORE=s3://…, from its blob by Range: the mirror keeps the bytes.
    const src = await this.deps.mirror.openBytes(first).catch(() => null);
    if (!src) {
      const where = this.deps.mirror.bucket ? "in the mirror's bucket" : 'on disk (removed by hand?)';
      return fail(
        new ConflictError(`${model}/${version}/${first.file} is listed as present but is not ${where}: fetch it again`),
      );
    }
    let facts: ReturnType<typeof factsOf>;
    try {
      facts = factsOf(await readGguf(src, knownTensorTypes));
    } finally {
      await src.close();
    }
    const online = await this.deps.fleet.online();
    const build = await this.deps.fleet.llamaCppBuild(this.deps.config.llamaCppBuild ?? newestBuild, online);
    const verdict = verdictFor(facts.architecture, build.build, build.source);
    const context = Math.min(
      parsed.value.context ?? facts.contextLength ?? 4096,
      parsed.value.context ?? this.deps.config.maxContext,
    );
    const weights = ggufs.reduce((n, f) => n + Number(f.bytesDone), 0);
    const memory = estimateMemory(facts, weights, context);
    const neededMiB = Math.ceil(memory.totalBytes / 2 ** 20);
    const fitsOn = online.map((n) => {
      const free = freeMiB(n);
      return {
        node: n.name,
        fits: free >= neededMiB,
        reason:
          free >= neededMiB
            ? `${free} MiB free`
            : nodeGpus(n).length === 0
              ? noGpuReason(n.name, neededMiB)
              : `needs ${neededMiB} MiB, ${free} MiB free`,
      };
    });
    return ok({
      name,
      engine: 'llamacpp',
      source: this.deps.mirror.fileUrl(first),
      architecture: facts.architecture,
      verdict,
      memory,
      fitsOn,
    });
  }

  /** Puts a present mirror version into the catalog. Answered as placed on the next pass: nothing is serving yet. */
  async serveMirrorVersion(
    actor: Actor,
    input: {
      model: string;
      version: string;
      name?: string | null;
      context?: number | null;
      mode?: string | null;
      replicas?: number | null;
      parallel?: number | null;
    },
  ): Promise<Result<{ model: CatalogModel; plan: ServePlan; message: string }>> {
    const extra = parseInput(
      z.object({ mode: modeInput.nullish(), replicas: replicasInput.nullish(), parallel: parallelInput.nullish() }),
      { mode: input.mode, replicas: input.replicas, parallel: input.parallel },
      '',
    );
    if (!extra.ok) return extra;
    const planned = await this.plan(input, actor.viewer);
    if (!planned.ok) return planned;
    const plan = planned.value;
    // A model's name or an adapter's: requests name either, so one may not take the other's (served-names.ts).
    const taken = await this.names.refusal(actor.viewer, plan.name, 'choose another name');
    if (taken) return fail(taken);
    // Checked now, not on a node later: a file removed between the listing and this click fails here.
    // The server's own pass through a mirror that requires tokens (HANGAR_MIRROR_REQUIRE_TOKEN).
    const headers = { authorization: `Bearer ${this.deps.mirror.internalToken}` };
    // A vLLM source is the version's directory, which is not a file to HEAD: its config.json (or first file) is.
    let probe = plan.source;
    if (plan.source.endsWith('/')) {
      const v = await this.deps.mirror.version(input.model, input.version);
      const file = v?.files.find((f) => f.file === 'config.json') ?? v?.files[0];
      if (file) probe = this.deps.mirror.fileUrl(file);
    }
    const head = await fetch(probe, { method: 'HEAD', headers, signal: AbortSignal.timeout(10_000) }).catch(
      (e: Error) => e,
    );
    if (head instanceof Error || !head.ok) {
      return fail(
        new UpstreamError(
          `the source ${probe} did not answer a HEAD request (${head instanceof Error ? head.message : `HTTP ${head.status}`})`,
        ),
      );
    }
    const mode = extra.value.mode ?? 'ALWAYS';
    const created = await this.names.claim(actor.viewer, plan.name, 'choose another name', () =>
      this.deps.db.$transaction(async (tx) => {
        const m = await tx.catalogModel.create({
          data: {
            name: plan.name,
            source: plan.source,
            engine: plan.engine,
            contextSize: plan.memory?.context ?? input.context ?? null,
            memoryBytes: plan.memory ? BigInt(plan.memory.totalBytes) : null,
            parallel: extra.value.parallel ?? 1,
            ...scaling(mode, extra.value.replicas ?? 1),
          },
        });
        await this.deps.audit.done(tx, actor, {
          action: 'serveMirrorVersion',
          target: plan.name,
          message: `from ${input.model}/${input.version}, ${mode.toLowerCase().replace('_', ' ')}`,
        });
        await notify(tx, 'mirrorVersion', `${input.model}/${input.version}`);
        return m;
      }),
    );
    if (!created.ok) return created;
    const model = created.value;
    void this.deps.fleet.place();
    const message =
      mode === 'STOPPED'
        ? `${plan.name} is in the catalog, stopped`
        : mode === 'ON_DEMAND'
          ? `${plan.name} is in the catalog, on demand: a replica starts when asked`
          : `${plan.name} is in the catalog: replicas are placed on the next pass`;
    return ok({ model, plan, message });
  }

  async setMode(
    actor: Actor,
    input: { name: string; mode: string; replicas?: number | null; parallel?: number | null },
  ): Promise<Result<CatalogModel>> {
    const parsed = parseInput(
      z.object({
        name: catalogName,
        mode: modeInput,
        replicas: replicasInput.nullish(),
        parallel: parallelInput.nullish(),
      }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const m = await this.visibleModel(actor, parsed.value.name);
    if (!m) return fail(new NotFoundError(`the catalog has no model ${parsed.value.name}`));
    if (m.declared) return fail(new ConflictError(declaredMessage(m.name, this.declaredIn(m.name))));
    const s = scaling(parsed.value.mode, parsed.value.replicas ?? Math.max(1, m.maxReplicas));
    // A running replica keeps the sequences it was loaded with; new ones get the new number.
    const parallel = parsed.value.parallel ?? m.parallel;
    const result = ok(
      await this.deps.db.$transaction(async (tx) => {
        // Awake means something only on demand: a model set to always or stopped keeps no timer to show. One set
        // on demand while a replica serves stays awake its idle time from now, as if woken, rather than having a
        // warm replica stopped under its callers the moment the mode changes.
        const running =
          parsed.value.mode === 'ON_DEMAND' && modeOf(m) !== 'ON_DEMAND' ? await runningReplicas(tx, m.id) : 0;
        // On PostgreSQL's now(), as a wake writes it (wakeIfAsleep): two clocks would let a wake just after this
        // land before it.
        const now = running ? (await tx.$queryRaw<{ now: Date }[]>`SELECT now() AS now`)[0]?.now : undefined;
        const awakeUntil =
          parsed.value.mode !== 'ON_DEMAND'
            ? null
            : now
              ? new Date(now.getTime() + m.idleSeconds * 1000)
              : m.awakeUntil;
        const updated = await tx.catalogModel.update({
          where: { id: m.id },
          // A fixed count: the autoscaler's target goes (setModelScaling sets one again).
          data: { ...s, parallel, awakeUntil, targetInFlight: null },
        });
        const key = mirrorKeyOf(m.source);
        if (key) await notify(tx, 'mirrorVersion', key);
        await this.deps.audit.done(tx, actor, {
          action: 'setModelMode',
          target: m.name,
          message: `${modeOf(m)} → ${parsed.value.mode} (${s.minReplicas}–${s.maxReplicas} replicas${parallel !== m.parallel ? `, ${m.parallel} → ${parallel} requests at once` : ''})`,
          owner: m.owner,
        });
        return updated;
      }),
    );
    // Answered once the pass has acted on it, so the answer holds the replicas as that pass left them. Answered
    // before, it could reach the console after the live event of the pass and put the replicas back as they were
    // (graphcache keeps the last write): a stopped model's pending replica stayed on its card.
    await this.deps.fleet.place();
    return result;
  }

  /**
   * Who may call a model at /v1: an owner in the forms OrgService.resolveOwner reads (org:, team:, project:,
   * user:, key:), or null for every caller again. Its adapters are narrowed by their own owners on top.
   */
  async setOwner(actor: Actor, input: { name: string; owner?: string | null }): Promise<Result<CatalogModel>> {
    const parsed = parseInput(
      z.object({ name: catalogName, owner: z.string().max(400, 'at most 400 characters').nullish() }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const m = await this.visibleModel(actor, parsed.value.name);
    if (!m) return fail(new NotFoundError(`the catalog has no model ${parsed.value.name}`));
    if (m.declared) return fail(new ConflictError(declaredMessage(m.name, this.declaredIn(m.name))));
    // An empty owner from a cleared form field means public, as null does.
    const wanted = parsed.value.owner?.trim() ? parsed.value.owner.trim() : null;
    const before = m.owner ? await this.deps.org.formatOwner(m.owner) : 'every caller';
    return this.deps.db.$transaction(async (tx) => {
      let owner: string | null = null;
      let label = 'every caller';
      if (wanted) {
        // Under the organisation tree's lock the owner cannot be deleted between this check and the commit.
        await lockOrgTree(tx);
        const resolved = await this.deps.org.resolveOwner(wanted, { db: tx });
        if (!resolved.ok) return resolved;
        owner = ownerKey(resolved.value);
        label = resolved.value.label;
      }
      const updated = await tx.catalogModel.update({ where: { id: m.id }, data: { owner } });
      await this.deps.audit.done(tx, actor, {
        action: 'setModelOwner',
        target: m.name,
        message: `owner ${before} → ${label}`,
        // Filed under the owner it has now; made public again, under the one it had (whose name the row says).
        owner: owner ?? m.owner,
      });
      return ok(updated);
    });
  }

  /** setModelRouting: how the gateway picks a replica for the model's requests (model-routing.ts). */
  async setRouting(actor: Actor, input: { name: string; policy: string }): Promise<Result<CatalogModel>> {
    const m = await this.routedModel(actor, input.name);
    return m.ok ? setRouting(this.routingDeps(), actor, m.value, input.policy) : m;
  }

  /** setModelScaling: the bounds and target of the model's autoscaling (model-scaling.ts). */
  async setScaling(
    actor: Actor,
    input: { name: string; minReplicas: number; maxReplicas: number; targetInFlight: number },
  ): Promise<Result<CatalogModel>> {
    const m = await this.routedModel(actor, input.name);
    if (!m.ok) return m;
    return setScaling(
      {
        db: this.deps.db,
        audit: this.deps.audit,
        place: () => this.deps.fleet.place(),
        declaredIn: (n) => this.declaredIn(n),
      },
      actor,
      m.value,
      input,
    );
  }

  /** setModelFallbacks: the models that answer in its place when it cannot (model-routing.ts). */
  async setFallbacks(actor: Actor, input: { name: string; fallbacks: string[] }): Promise<Result<CatalogModel>> {
    const m = await this.routedModel(actor, input.name);
    return m.ok ? setFallbacks(this.routingDeps(), actor, m.value, input.fallbacks) : m;
  }

  private async routedModel(actor: Actor, name: string): Promise<Result<CatalogModel>> {
    const parsed = parseInput(z.object({ name: catalogName }), { name }, '');
    if (!parsed.ok) return parsed;
    const m = await this.visibleModel(actor, parsed.value.name);
    return m ? ok(m) : fail(new NotFoundError(`the catalog has no model ${parsed.value.name}`));
  }

  private routingDeps(): ModelRoutingDeps {
    return { db: this.deps.db, audit: this.deps.audit, visibleModel: (a, n) => this.visibleModel(a, n) };
  }

  async wake(actor: Actor, input: { name: string }): Promise<Result<CatalogModel>> {
    const parsed = parseInput(z.object({ name: catalogName }), input, '');
    if (!parsed.ok) return parsed;
    const m = await this.visibleModel(actor, parsed.value.name);
    if (!m) return fail(new NotFoundError(`the catalog has no model ${parsed.value.name}`));
    const notOnDemand = () =>
      fail(
        new ConflictError(
          `${m.name} is ${modeOf(m).toLowerCase().replace('_', ' ')}, not on demand: only an on-demand model is woken`,
        ),
      );
    if (modeOf(m) !== 'ON_DEMAND') return notOnDemand();
    // An operator's wake moves the timer on even while the model is awake (the Models page's Wake button on a
    // serving model: "keep it up a while longer"), and is audited each time it is pressed.
    const woken = await this.wakeIfAsleep(actor, m, { evenIfAwake: true });
    // Set to always or stopped between the read above and the write: refused as it would have been a moment later.
    return woken ? ok(woken) : notOnDemand();
  }

  /**
   * The one way an on-demand model is woken (the wakeModel mutation, and the gateway for a request that finds no
   * replica ready): awake its idle time from now, audited as wakeModel, then a placement pass, so a replica is
   * placed before this returns. The check and the write are one statement on PostgreSQL's now() (db/clock.ts), so
   * servers woken by requests at the same moment audit one wake, not one per request. Answers the model as woken,
   * or null when it was not (awake already, unless `evenIfAwake`; not on demand; gone).
   */
  async wakeIfAsleep(
    actor: Actor,
    model: Pick<CatalogModel, 'id' | 'name' | 'owner'>,
    how: {
      /** Moves the timer on also while the model is awake (an operator's wake); a request's wake leaves it. */
      evenIfAwake?: boolean;
      /** Said before "awake until …" in the audit's message: who woke it, when it was not an operator. */
      why?: string;
    } = {},
  ): Promise<CatalogModel | null> {
    const evenIfAwake = how.evenIfAwake ?? false;
    const woken = await this.deps.db.$transaction(async (tx) => {
      const rows = await tx.$queryRaw<{ awakeUntil: Date }[]>`
        UPDATE "CatalogModel" SET "awakeUntil" = now() + "idleSeconds" * interval '1 second'
        WHERE id = ${model.id}::uuid AND "minReplicas" = 0 AND "maxReplicas" > 0
          AND (${evenIfAwake}::boolean OR "awakeUntil" IS NULL OR "awakeUntil" < now())
        RETURNING "awakeUntil"`;
      const row = rows[0];
      if (!row) return null;
      await this.deps.audit.done(tx, actor, {
        action: 'wakeModel',
        target: model.name,
        message: `${how.why ? `${how.why}; ` : ''}awake until ${row.awakeUntil.toISOString()}`,
        owner: model.owner,
      });
      return tx.catalogModel.findUniqueOrThrow({ where: { id: model.id } });
    });
    // Also when it was awake already: the request waiting on it wants its replica placed now, not on the next
    // pass; and the operator's answer comes after the pass that places it, as setModelMode's does.
    await this.deps.fleet.place();
    return woken;
  }

  /**
   * Each model's last request as the gateway saw it (usage.ts, batched once a second off the request path, in the
   * same transaction as its usage rows): an on-demand model's idle clock runs from it. `db` is that transaction.
   */
  recordLastRequest(
    lastRequests: readonly (readonly [model: string, at: Date])[],
    db: LastRequestDb = this.deps.db.loops,
  ) {
    return recordLastRequest(db, lastRequests);
  }

  async remove(actor: Actor, input: { name: string }): Promise<Result<{ name: string }>> {
    const parsed = parseInput(z.object({ name: catalogName }), input, '');
    if (!parsed.ok) return parsed;
    const m = await this.visibleModel(actor, parsed.value.name);
    if (!m) return fail(new NotFoundError(`the catalog has no model ${parsed.value.name}`));
    if (m.declared) return fail(new ConflictError(declaredMessage(m.name, this.declaredIn(m.name))));
    await this.deps.db.$transaction(async (tx) => {
      await tx.catalogModel.delete({ where: { id: m.id } });
      const key = mirrorKeyOf(m.source);
      if (key) await notify(tx, 'mirrorVersion', key);
      await this.deps.audit.done(tx, actor, { action: 'removeModel', target: m.name, owner: m.owner });
    });
    return ok({ name: m.name });
  }

  /**
   * Where a declared model is changed: the file and its entry's key ("models.2", as a refusal of the file names
   * it), so the page can say where to go rather than only that it cannot change it here.
   */
  declaredIn(name: string): { file: string; key: string } | null {
    const at = this.declaredAt.get(name);
    const file = this.deps.config.configFile;
    return at === undefined || !file ? null : { file, key: `models.${at}` };
  }

  /** Reads hangar.yaml (HANGAR_CONFIG) and makes the catalog's declared models match it exactly. */
  async loadDeclared(): Promise<number> {
    const file = this.deps.config.configFile;
    if (!file) {
      await this.deps.db.catalogModel.deleteMany({ where: { declared: true } });
      return 0;
    }
    let raw: unknown;
    try {
      // The YAML parser is imported only when there is a hangar.yaml to read, not at every start.
      const { parse: parseYaml } = await import('yaml');
      raw = parseYaml(await fs.readFile(file, 'utf8'));
    } catch (err) {
      throw new ConfigError(`HANGAR_CONFIG=${file} could not be read as YAML: ${(err as Error).message}`);
    }
    const parsed = declaredFile.safeParse(raw ?? {});
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw new ConfigError(`HANGAR_CONFIG=${file}: ${issue?.path.join('.') || 'the file'}: ${issue?.message}`);
    }
    const models = parsed.data.models;
    this.declaredAt = new Map(models.map((m, i) => [m.name, i]));
    // An entry may not take an adapter's name: that adapter's callers would be answered by this model. The site's
    // own file, so the refusal names the adapter and its owner. Also an entry whose row lost its name to an
    // adapter when the namespace was made one (the served_names migration): it is refused until renamed.
    const heldByAdapter = async () => {
      for (const [i, m] of models.entries()) {
        const h = await this.names.holder(m.name);
        if (h?.kind === 'ADAPTER')
          return new ConfigError(
            `HANGAR_CONFIG=${file}: models.${i}.name: ${await this.names.describe(h)}: rename the entry`,
          );
      }
      return null;
    };
    const before = await heldByAdapter();
    if (before) throw before;
    await this.deps.db
      .$transaction(async (tx) => {
        await tx.catalogModel.deleteMany({ where: { declared: true, name: { notIn: models.map((m) => m.name) } } });
        for (const m of models) {
          const data = {
            source: m.source,
            engine: m.engine,
            contextSize: m.context ?? null,
            parallel: m.parallel,
            declared: true,
            ...scaling(m.mode, m.replicas),
          };
          await tx.catalogModel.upsert({ where: { name: m.name }, create: { name: m.name, ...data }, update: data });
        }
      })
      // An adapter published between the check and the write: the constraint refused the entry.
      .catch(async (err: unknown) => {
        throw (isNameClash(err) && (await heldByAdapter())) || err;
      });
    this.deps.log.info('read the declared models', { file, models: models.length });
    return models.length;
  }
}

/** "model/version" of the mirror version a catalog source points into, so its row's usedBy can be refreshed. */
function mirrorKeyOf(source: string): string | null {
  const m = source.match(/\/mirror\/([^/]+)\/([^/]+)\//);
  return m ? `${decodeURIComponent(m[1] ?? '')}/${decodeURIComponent(m[2] ?? '')}` : null;
}
