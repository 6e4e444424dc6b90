import { createHash, randomUUID } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { knownTensorTypes } from '@hangar/common/gguf/catalog';
import { factsOf } from '@hangar/common/gguf/facts';
import { readGguf } from '@hangar/common/gguf/reader';
import { fileSource } from '@hangar/common/gguf/source';
import type { Logger } from '@hangar/common/log';
import { AdapterConversionError, peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { PeftTarError, readPeftTar } from '@hangar/common/peft/peft-tar';
import { readSafetensors } from '@hangar/common/peft/safetensors';
import tar from 'tar-stream';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, logFor } from '../auth/actor.js';
import { addAdapter, modelByName } from '../catalog/catalog-store.js';
import type { ServedNames } from '../catalog/served-names.js';
import type { Db } from '../db/client.js';
import type { TrainArtifact, TrainJob } from '../generated/prisma/client.js';
import {
  ConflictError,
  fail,
  NotFoundError,
  ok,
  type Result,
  UnauthenticatedError,
  UnprocessableError,
  UpstreamError,
  ValidationError,
} from '../lib/errors.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { mirrorFileRow } from '../mirror/mirror-store.js';
import { notify } from '../pubsub.js';
import { checkAdapterBytes, peftMisfit } from './adapter-fit.js';
import { catalogGguf } from './model-file.js';
import type { TrainService } from './train.service.js';

// What a job made: the PEFT adapter the node uploads (a gzipped tar, checked as it is read, never unpacked to
// disk) and the llama.cpp GGUF adapter Hangar makes from it; then publishing them into the mirror and the catalog.

const TRAIN_ANEW = 'train under another name';

/** The compressed upload at most (the tar reader caps the weights inside at 2 GiB: rank 128 on a 70B model). */
export const MAX_PEFT_UPLOAD = 4 * 1024 ** 3;

/** What an accepted adapter upload made: the PEFT tar and, for llama.cpp models, the GGUF adapter. */
export type UploadedArtifacts = { artifacts: { kind: string; size: number; sha256: string }[] };

export type PublishAnswer = {
  adapter: string;
  model: string;
  source: string;
  owner: string | null;
  note: string;
  /** Whether the model's replicas take it as they run (they do, on llama.cpp and vLLM): nothing to restart. */
  liveWithoutRestart: boolean;
};

export class TrainArtifacts {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly train: TrainService;
  private readonly mirror: MirrorService;
  private readonly log: Logger;
  private readonly names: ServedNames;

  constructor(deps: {
    db: Db;
    audit: AuditService;
    train: TrainService;
    mirror: MirrorService;
    log: Logger;
    names: ServedNames;
  }) {
    this.db = deps.db;
    this.audit = deps.audit;
    this.train = deps.train;
    this.mirror = deps.mirror;
    this.log = deps.log;
    this.names = deps.names;
  }

  peftName(job: Pick<TrainJob, 'name'>) {
    return `${job.name}-peft.tar.gz`;
  }
  ggufName(job: Pick<TrainJob, 'name'>) {
    return `${job.name}.gguf`;
  }

  /**
   * PUT /api/train/jobs/<id>/artifacts/peft from the node running the job. A tar that breaks a rule fails the
   * job with the reason (UnprocessableError, 422 at the edge): the trainer's output is not something Hangar will
   * keep or hand to a node.
   */
  async ingestPeft(
    actor: Actor,
    id: string,
    body: Readable,
    length: number | null,
  ): Promise<Result<UploadedArtifacts>> {
    if (actor.viewer.kind !== 'node') return fail(new UnauthenticatedError('an adapter upload needs the node token'));
    const job = await this.train.get(id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (job.state !== 'RUNNING' || job.leaseOwner !== actor.viewer.node.id)
      return fail(new ConflictError(`the job is ${job.state.toLowerCase()} and not this node's to upload to`));
    if (length !== null && length > MAX_PEFT_UPLOAD) {
      const reason = `the adapter upload is ${length} bytes; at most ${MAX_PEFT_UPLOAD}`;
      await this.train.failRunning(id, `the adapter was refused: ${reason}`);
      return fail(new UnprocessableError(reason));
    }
    const dir = this.train.jobDir(id);
    await fs.mkdir(dir, { recursive: true });
    // A name of its own per upload: an agent's retry may arrive while its first try is still being read.
    const part = path.join(dir, `peft.${randomUUID()}.part`);
    const hash = createHash('sha256');
    let size = 0;
    try {
      await pipeline(
        body,
        async function* (source: AsyncIterable<Buffer>) {
          for await (const chunk of source) {
            size += chunk.length;
            if (size > MAX_PEFT_UPLOAD) throw new PeftTarError(`the upload is over ${MAX_PEFT_UPLOAD} bytes`);
            hash.update(chunk);
            yield chunk;
          }
        },
        createWriteStream(part),
      );
    } catch (err) {
      await fs.rm(part, { force: true });
      if (err instanceof PeftTarError) {
        await this.train.failRunning(id, `the adapter was refused: ${err.message}`);
        return fail(new UnprocessableError(err.message));
      }
      // The connection broke: the agent may try again; the job is still its to finish.
      return fail(new ValidationError('body', `the upload broke off after ${size} bytes: ${(err as Error).message}`));
    }

    let contents: Awaited<ReturnType<typeof readPeftTar>>;
    try {
      contents = await readPeftTar(createReadStream(part));
    } catch (err) {
      await fs.rm(part, { force: true });
      const reason = err instanceof PeftTarError ? err.message : `the tar could not be read: ${(err as Error).message}`;
      logFor(this.log, actor).warn('refused an adapter upload', { job: id, node: actor.viewer.node.name, reason });
      await this.train.failRunning(id, `the adapter was refused: ${reason}`);
      return fail(new UnprocessableError(reason));
    }
    const peftSha = hash.digest('hex');
    // On a bucket, into it (every replica serves and publishes it); the file stays as this replica's copy.
    const peftPath = await this.train.files.keepArtifact(
      await renamed(part, path.join(dir, this.peftName(job))),
      peftSha,
    );

    // The GGUF adapter, for models llama.cpp serves: made here, so the node needs no llama.cpp tooling.
    let gguf: { path: string; size: number; sha256: string } | null = null;
    let ggufWarning: string | null = null;
    if (job.gguf) {
      const base = await this.baseFacts(job.model);
      if (!base.ok) ggufWarning = `no GGUF adapter made: ${base.reason}`;
      else {
        try {
          const bytes = peftToGguf({ config: contents.config, safetensors: contents.weights, base: base.value });
          const file = path.join(dir, this.ggufName(job));
          const ggufPart = `${file}.${randomUUID()}.part`;
          await fs.writeFile(ggufPart, bytes);
          const sha256 = createHash('sha256').update(bytes).digest('hex');
          const kept = await this.train.files.keepArtifact(await renamed(ggufPart, file), sha256);
          gguf = { path: kept, size: bytes.length, sha256 };
        } catch (err) {
          if (!(err instanceof AdapterConversionError)) throw err;
          // llama.cpp could not use it: the job failed at its purpose. The PEFT files stay downloadable.
          await this.record(job, { kind: 'peft', path: peftPath, size, sha256: peftSha, files: contents.files });
          await this.train.failRunning(id, `the adapter cannot be made into a llama.cpp GGUF: ${err.message}`);
          return fail(new UnprocessableError(err.message));
        }
      }
    }
    const artifacts = [
      await this.record(job, { kind: 'peft', path: peftPath, size, sha256: peftSha, files: contents.files }),
    ];
    if (gguf) artifacts.push(await this.record(job, { kind: 'gguf', ...gguf, files: null }));
    await this.db.$transaction(async (tx) => {
      await this.train.event(
        tx,
        id,
        ggufWarning ? 'warn' : 'info',
        [
          `adapter received: ${contents.files.map((f) => f.name).join(', ')} (${size} bytes, sha256 ${peftSha})`,
          gguf ? `GGUF adapter made: ${gguf.size} bytes, sha256 ${gguf.sha256}` : ggufWarning,
        ]
          .filter(Boolean)
          .join('; '),
      );
      await notify(tx, 'trainJob', id);
    });
    return ok({ artifacts: artifacts.map((a) => ({ kind: a.kind, size: Number(a.size), sha256: a.sha256 })) });
  }

  private async record(
    job: TrainJob,
    a: { kind: 'peft' | 'gguf'; path: string; size: number; sha256: string; files: unknown },
  ): Promise<TrainArtifact> {
    const data = { size: BigInt(a.size), sha256: a.sha256, path: a.path, files: a.files ?? undefined };
    return this.db.trainArtifact.upsert({
      where: { jobId_kind: { jobId: job.id, kind: a.kind } },
      create: { jobId: job.id, kind: a.kind, ...data },
      update: data,
    });
  }

  /** The base model's architecture and head counts, from the catalog model's GGUF in the mirror. */
  private async baseFacts(
    modelName: string,
  ): Promise<
    | { ok: true; value: { architecture: string; headCount: number; headCountKv: number } }
    | { ok: false; reason: string }
  > {
    const local = await catalogGguf(this.db, this.mirror, modelName);
    if (!local.ok) return local;
    // The header only: by Range from a bucket, so a model of tens of GB costs megabytes here.
    const src = await local.bytes().catch(() => null);
    if (!src)
      return { ok: false, reason: `${local.source} is not ${this.mirror.bucket ? 'in the bucket' : 'on disk'}` };
    try {
      const f = factsOf(await readGguf(src, knownTensorTypes));
      if (!f.architecture || !f.heads)
        return { ok: false, reason: `${local.source} does not say its architecture and heads` };
      return {
        ok: true,
        value: { architecture: f.architecture, headCount: f.heads, headCountKv: f.kvHeads ?? f.heads },
      };
    } catch (err) {
      return { ok: false, reason: `${local.source} could not be read: ${(err as Error).message}` };
    } finally {
      await src.close();
    }
  }

  async artifact(jobId: string, kind: string) {
    if (kind !== 'peft' && kind !== 'gguf') return null;
    const job = await this.train.get(jobId);
    if (!job) return null;
    const a = await this.db.trainArtifact.findUnique({ where: { jobId_kind: { jobId, kind } } });
    return a ? { job, artifact: a, filename: kind === 'gguf' ? this.ggufName(job) : this.peftName(job) } : null;
  }

  // ─── publishing ────────────────────────────────────────────────────────────

  /**
   * Puts what a DONE job made into the mirror and makes it the model's adapter: the GGUF for a model llama.cpp
   * serves, the PEFT files for one vLLM serves. The lineage is kept on the adapter: job and artifact sha256.
   */
  async publish(
    actor: Actor,
    id: string,
    o: { force?: boolean | null; reason?: string | null } = {},
  ): Promise<Result<PublishAnswer>> {
    const job = await this.train.visible(actor, id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (job.state !== 'DONE')
      return fail(new ConflictError(`the job has not finished: it is ${job.state.toLowerCase()}`));
    // Before anything is written: an adapter clearly worse than its base is not published unless forced (eval-store.ts).
    const gate = await this.train.evaluations.gate(job, o);
    if (!gate.ok) return gate;
    const model = await modelByName(this.db, job.model);
    if (!model)
      return fail(
        new ConflictError(`the model ${job.model} is no longer in the catalog: serve it again, then publish`),
      );
    // A model's name or an adapter's (this one, published before): requests name either (catalog/served-names.ts).
    const taken = await this.names.refusal(actor.viewer, job.name, TRAIN_ANEW);
    if (taken) return fail(taken);

    const llama = model.engine === 'llamacpp';
    const kind = llama ? 'gguf' : 'peft';
    const art = await this.db.trainArtifact.findUnique({ where: { jobId_kind: { jobId: id, kind } } });
    if (!art)
      return fail(
        new ConflictError(
          llama
            ? 'the job made no GGUF adapter, which llama.cpp needs: train again with gguf on'
            : 'the job made no PEFT adapter',
        ),
      );

    // Against the model's file as the catalog has it now, before anything is saved: the job trained on the weights
    // as they were, and an adapter that does not fit them would fail on every replica (or load and answer nonsense).
    if (llama) {
      const local = await catalogGguf(this.db, this.mirror, model.name);
      // Both headers only: the adapter from its file (on a bucket, this replica's verified copy), the model's by
      // Range from wherever the mirror keeps it.
      const misfit = local.ok
        ? await checkAdapterBytes(
            async () => fileSource(await this.train.files.artifactFile(art)),
            local.bytes,
            model.name,
          )
        : `${job.name} cannot be checked against ${model.name}: ${local.reason}`;
      if (misfit) return fail(new ConflictError(`not published: ${misfit}. Nothing was changed`));
    } else {
      const misfit = await this.peftFits(model, await this.train.files.artifactFile(art));
      if (misfit) return fail(new ConflictError(`not published: ${misfit}. Nothing was changed`));
    }

    // Into the mirror, verified against the artifact's sha256 like any other upload.
    const version = `job-${id.slice(0, 8)}`;
    let source: string;
    if (llama) {
      const file = this.ggufName(job);
      const up = await this.mirror.upload(
        actor,
        { model: job.name, version, file, sha256: art.sha256, size: Number(art.size) },
        await this.train.files.artifactStream(art),
      );
      if (!up.ok) return fail(new UpstreamError(`keeping the adapter in the mirror failed: ${up.error.message}`));
      source = this.mirror.fileUrl({ model: job.name, version, file });
    } else {
      const published = await this.publishPeftFiles(actor, job, version, await this.train.files.artifactFile(art));
      if (!published.ok) return published;
      source = this.mirror.versionUrl(job.name, version);
    }

    const created = await this.names.claim(actor.viewer, job.name, TRAIN_ANEW, () =>
      this.db.$transaction(async (tx) => {
        await addAdapter(tx, {
          name: job.name,
          source,
          owner: job.owner,
          modelId: model.id,
          trainJobId: job.id,
          artifactSha256: art.sha256,
        });
        await this.train.event(tx, id, 'info', `published as ${model.name}'s adapter ${job.name}: ${source}`);
        await this.audit.done(tx, actor, {
          action: 'publishTrainJob',
          target: job.name,
          message: `${model.name} adapter from job ${id}, ${kind} sha256 ${art.sha256}, data sha256 ${job.dataSha256}; ${gate.value.audit}`,
          owner: job.owner,
        });
        await this.train.evaluations.published(tx, id);
        await notify(tx, 'trainJob', id);
      }),
    );
    if (!created.ok) {
      // A model took the name while the files went in: they go again, so nothing is left half-published.
      await this.mirror.remove(actor, { model: job.name, version, force: true });
      return created;
    }
    const note = llama
      ? `${model.name}'s llama.cpp replicas load ${job.name} within seconds, without a restart: each one's agent fetches it at its next poll and lists it in the replica's message once loaded, and requests for it go to the replicas that hold it (replicas run by llama-server load it at their next start)`
      : `the PEFT files are at ${source}; ${model.name}'s vLLM replicas load ${job.name} without a restart: each one's agent fetches the version's files whole (each verified) at its next poll, loads them with vLLM's /v1/load_lora_adapter and lists it in the replica's message once vLLM took it; requests for it go to the replicas that hold it`;
    return ok({ adapter: job.name, model: model.name, source, owner: job.owner, note, liveWithoutRestart: true });
  }

  /**
   * Why a PEFT adapter does not fit the vLLM model's weights in the mirror (its version's config.json), or null:
   * also when the model's config is not in this mirror or does not say, which leaves vLLM to judge.
   */
  private async peftFits(model: { name: string; source: string }, tarPath: string): Promise<string | null> {
    const at = /\/mirror\/([^/]+)\/([^/]+)\//.exec(model.source);
    if (!at) return null;
    const [name, version] = [decodeURIComponent(at[1] ?? ''), decodeURIComponent(at[2] ?? '')];
    const row = await mirrorFileRow(this.db, name, version, 'config.json');
    if (row?.state !== 'PRESENT') return null;
    let config: Record<string, unknown>;
    try {
      // From the data dir or the bucket (HANGAR_MIRROR_STORE=s3://…): the mirror knows where its bytes are.
      config = JSON.parse(await this.mirror.readText(row));
    } catch {
      return null;
    }
    const contents = await readPeftTar(createReadStream(tarPath));
    return peftMisfit([...readSafetensors(contents.weights).tensors.values()], config, model.name);
  }

  /** The PEFT tar's files, one by one into the mirror version (vLLM loads the adapter directory). */
  private async publishPeftFiles(actor: Actor, job: TrainJob, version: string, tarPath: string): Promise<Result<true>> {
    const extract = tar.extract();
    const failure: { error?: string } = {};
    const done = new Promise<void>((resolve, reject) => {
      extract.on('entry', (header, stream, next) => {
        if (header.type !== 'file' || failure.error) {
          stream.resume();
          stream.on('end', next);
          return;
        }
        const file = header.name.replace(/^\.\//, '');
        this.mirror.upload(actor, { model: job.name, version, file, size: header.size ?? null }, stream).then((r) => {
          if (!r.ok) failure.error = `${file}: ${r.error.message}`;
          stream.resume();
          next();
        }, reject);
      });
      extract.on('finish', resolve);
      extract.on('error', reject);
    });
    await pipeline(createReadStream(tarPath), createGunzip(), extract).catch((err) => {
      failure.error ??= (err as Error).message;
    });
    await done.catch((err) => {
      failure.error ??= (err as Error).message;
    });
    if (failure.error) return fail(new UpstreamError(`keeping the adapter in the mirror failed: ${failure.error}`));
    return ok(true);
  }
}

/** Renames `from` to `to`, answering `to`. */
async function renamed(from: string, to: string): Promise<string> {
  await fs.rename(from, to);
  return to;
}
