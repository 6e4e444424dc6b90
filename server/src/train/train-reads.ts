import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import { z } from 'zod';
import type { Actor } from '../auth/actor.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import type { TrainJob } from '../generated/prisma/client.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { sees } from '../org/org-owners.js';
import type { BaseFile } from './base-files.js';
import {
  checkTrainData,
  type LengthStats,
  pairsOf,
  stats,
  TRAIN_MAX_DATA_BYTES,
  type TrainDataLine,
  type TrainDataReport,
} from './data.js';
import type { EvalSpec } from './eval-job.js';
import { catalogGguf } from './model-file.js';
import type { OwnerRules } from './owner.js';
import { TRAIN_PARAMS, type TrainParams } from './params.js';
import { Tokenizers } from './tokens.js';
import { TrainFiles } from './train-files.js';

// Training jobs: the rules of DESIGN.md §5 "Train" and docs/training.md. Every state change is one transaction
// that also records an event and queues the NOTIFY, so the console, scripts and the node's agent all read the
// same truth, and a server restart loses nothing: the job's state is the database's.
//
// The service is composed of parts, each given what it needs: this one (paths, reads, the pairs), train-ledger.ts
// (how a change is written: events, NOTIFYs, a job's end), train-node.ts (the node's protocol: work, claim,
// reports), train-sweep.ts (the lost-node clock) and train.service.ts (what people ask: submit, cancel, remove).

export type TrainSpec = {
  id: string;
  name: string;
  base_repo: string;
  base_revision: string | null;
  params: TrainParams;
  data: { url: string; sha256: string; bytes: number; pairs: number };
  base: { files: BaseFile[] };
  gguf: boolean;
  /** The held-out pairs and what the node evaluates the adapter with (eval-job.ts). */
  eval?: EvalSpec;
};

export type TrainWorkItem = {
  id: string;
  name: string;
  state: 'QUEUED' | 'RUNNING';
  gpuMiB: number;
  cancelRequested: boolean;
};

const uuid = z.string().uuid();

export const ENDED = ['DONE', 'FAILED', 'CANCELLED'] as const;
export const ended = (s: string) => (ENDED as readonly string[]).includes(s);

/** What the reads need: the database, where files live, the mirror (a model's GGUF for token counts), owners. */
export type TrainReadsDeps = { db: Db; config: Config; mirror: MirrorService; owners: OwnerRules; log: Logger };

export class TrainReads {
  readonly dataDir: string;
  readonly jobsDir: string;
  /** Where the pairs and artifacts are kept: the data dir, or the mirror's bucket (train-files.ts). */
  readonly files: TrainFiles;
  private readonly db: Db;
  private readonly config: Config;
  private readonly mirror: MirrorService;
  private readonly owners: OwnerRules;
  private readonly tokenizers: Tokenizers;
  /** Until the server listens, the address it will: HANGAR_PUBLIC_URL, when set, wins over it. */
  private baseUrl: () => string = () => 'http://127.0.0.1';

  constructor(deps: TrainReadsDeps) {
    this.db = deps.db;
    this.config = deps.config;
    this.mirror = deps.mirror;
    this.owners = deps.owners;
    this.dataDir = path.join(deps.config.dataDir, 'train', 'data');
    this.jobsDir = path.join(deps.config.dataDir, 'train', 'jobs');
    this.tokenizers = new Tokenizers({ log: deps.log });
    this.files = new TrainFiles({ db: deps.db, mirror: deps.mirror });
  }

  setBaseUrl(get: () => string) {
    this.baseUrl = get;
  }
  private base() {
    return this.config.publicUrl ?? this.baseUrl();
  }
  dataUrl(id: string) {
    return `${this.base()}/api/train/jobs/${id}/data`;
  }
  dataFile(sha256: string) {
    return path.join(this.dataDir, `${sha256}.ndjson`);
  }
  jobDir(id: string) {
    return path.join(this.jobsDir, id);
  }
  /** Kept pairs as text (an upload's, an evaluation file's), or null when none are kept under this sha256. */
  readData(sha256: string): Promise<string | null> {
    return this.files.dataText(sha256, this.dataFile(sha256));
  }
  /** A job's pairs as text. */
  async jobData(job: Pick<TrainJob, 'dataSha256' | 'dataPath'>): Promise<string> {
    const text = await this.files.dataText(job.dataSha256, job.dataPath);
    if (text === null) throw new Error(`the job's pairs (sha256 ${job.dataSha256}) are not kept any more`);
    return text;
  }

  /** Lets the token counters go (the server is stopping). */
  dispose() {
    return this.tokenizers.dispose();
  }

  // ─── reading ───────────────────────────────────────────────────────────────

  get(id: string) {
    return uuid.safeParse(id).success ? this.db.trainJob.findUnique({ where: { id } }) : Promise.resolve(null);
  }

  /**
   * A job as a person or script acting on it may see it: one owned by an owner that does not admit the actor reads
   * as none, in the same words (cancel, delete, publish), as it is absent from their lists.
   */
  async visible(actor: Actor, id: string): Promise<TrainJob | null> {
    const job = await this.get(id);
    return job && sees(await this.owners.sightOf(actor.viewer), job.owner) ? job : null;
  }

  /**
   * Who may read a job's pairs: the node it is for (it trains on them), and operators whom the job's owner admits
   * (admins always). Pairs from a team's knowledge base say what the base says, so an operator outside the team
   * may not read them, nor may another node.
   */
  async mayReadData(viewer: Viewer, job: Pick<TrainJob, 'nodeId' | 'owner'>): Promise<boolean> {
    if (viewer.kind === 'node') return job.nodeId !== null && viewer.node.id === job.nodeId;
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return false;
    return roleAtLeast(viewer.role, 'OPERATOR') && this.owners.mayRead(viewer, job.owner);
  }

  /**
   * Who may download what a job made. A public job's: any signed-in caller or node, as before. An owned job's:
   * those its owner admits (admins always) and the job's own node; an adapter repeats what it was trained on.
   */
  async mayReadArtifacts(viewer: Viewer, job: Pick<TrainJob, 'nodeId' | 'owner'>): Promise<boolean> {
    if (viewer.kind === 'node') return job.owner === null || (job.nodeId !== null && viewer.node.id === job.nodeId);
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return false;
    return this.owners.mayRead(viewer, job.owner);
  }

  /**
   * A page of jobs, newest first. `owners` (org-owners.ts seenOwners) keeps the public ones and those of these
   * owners, in the query, so a page is never cut short or counted by jobs the caller may not see; absent: all.
   */
  async page(input: { state?: string | null; first?: number | null; after?: string | null }, owners?: string[]) {
    const first = Math.min(Math.max(input.first ?? 50, 1), 200);
    const after = input.after ? await this.get(input.after) : null;
    const state =
      input.state && ['QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED'].includes(input.state)
        ? input.state
        : undefined;
    const rows = await this.db.trainJob.findMany({
      where: {
        ...(state ? { state: state as TrainJob['state'] } : {}),
        ...(owners ? { AND: [{ OR: [{ owner: null }, { owner: { in: owners } }] }] } : {}),
        ...(after
          ? { OR: [{ createdAt: { lt: after.createdAt } }, { createdAt: after.createdAt, id: { lt: after.id } }] }
          : {}),
      },
      orderBy: [{ createdAt: 'desc' }, { id: 'desc' }],
      take: first + 1,
    });
    return { rows: rows.slice(0, first), hasNextPage: rows.length > first };
  }

  // ─── the pairs ─────────────────────────────────────────────────────────────

  /**
   * The pairs as createTrainJob will read them; with `model`, also their lengths in that model's tokens (and
   * how many pass `maxLen`, 1024 by default as the trainer's).
   */
  async check(
    data: string,
    options: { model?: string | null; maxLen?: number | null; viewer?: Viewer } = {},
  ): Promise<TrainDataReport> {
    const report = checkTrainData(data);
    if (!options.model || report.pairs === 0) return report;
    const sight = options.viewer ? await this.owners.sightOf(options.viewer) : undefined;
    const local = await catalogGguf(this.db, this.mirror, options.model, sight);
    if (!local.ok) return { ...report, tokensNote: `no token counts: ${local.reason}` };
    const pairs = [...pairsOf(data)].filter((p): p is TrainDataLine => !('error' in p));
    try {
      // A file llama.cpp opens: on a bucket, this replica's verified local copy of the model (made once).
      const file = await local.file();
      const q = await this.tokenizers.count(
        file,
        pairs.map((p) => p.q),
      );
      const a = await this.tokenizers.count(
        file,
        pairs.map((p) => p.a),
      );
      const both = q.map((n, i) => n + (a[i] ?? 0));
      const r = TRAIN_PARAMS.max_len;
      const maxLen = options.maxLen && options.maxLen >= r.min && options.maxLen <= r.max ? options.maxLen : r.default;
      return {
        ...report,
        tokens: {
          model: options.model,
          question: stats(q) as LengthStats,
          answer: stats(a) as LengthStats,
          pair: stats(both) as LengthStats,
          maxLen,
          overMaxLen: both.filter((n) => n > maxLen).length,
        },
        tokensNote: null,
      };
    } catch (err) {
      return { ...report, tokensNote: `no token counts: the tokenizer could not be read (${(err as Error).message})` };
    }
  }

  /**
   * Keeps uploaded pairs by their sha256 (the same data uploaded twice is kept once) and returns the report.
   * Kept even when the report has errors: the console shows them, and createTrainJob refuses the sha256 then.
   */
  async storeData(
    data: string,
    options: { model?: string | null; maxLen?: number | null; viewer?: Viewer } = {},
  ): Promise<TrainDataReport> {
    const report = await this.check(data, options);
    if (report.bytes <= TRAIN_MAX_DATA_BYTES) await this.keepData(data, report.sha256);
    return report;
  }

  /**
   * Writes the pairs under their sha256, once: whole or not at all (a rename), so a crash leaves no half file.
   * Each upload writes a temporary file of its own: the same pairs sent eight times at once (a console tab and a
   * script, a retry) are eight renames of the same bytes onto one name, each answered with the same sha256.
   */
  async keepData(data: string, sha256: string) {
    if (this.files.inBucket) return this.files.keepData(data, sha256);
    const file = this.dataFile(sha256);
    await fs.mkdir(this.dataDir, { recursive: true });
    const exists = await fs.stat(file).then(
      () => true,
      () => false,
    );
    if (exists) return;
    const part = `${file}.${randomUUID()}.part`;
    try {
      await fs.writeFile(part, data);
      await fs.rename(part, file);
    } finally {
      await fs.rm(part, { force: true });
    }
  }
}
