import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, describeActor } from '../auth/actor.js';
import type { Viewer } from '../auth/viewer.js';
import type { Db } from '../db/client.js';
import type { KbDataset } from '../generated/prisma/client.js';
import { fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { type Chunk, chunkDocuments, type Pair, pairPrompt, pairsNdjson, parsePairs } from './kb-pairs.js';
import { isId } from './org-lookup.js';
import { ownerKey } from './org-owners.js';

// A collection turned into question/answer pairs by a served model. The model is called through this server's own
// /v1, with the credentials of the request that asked: the gateway decides, as for any call of theirs, whether the
// caller may call that model, which limits apply and what their usage is; nothing here goes around it. Progress is
// the KbDataset row, updated after every chunk; the pairs are kept as training data (TrainService.storeData), so
// `createTrainJob(dataSha256: …)` takes them, and the row stays as their lineage.

/** The headers that say who the caller is, as /v1 reads them (gateway/callers.ts). */
export type CallerCredentials = { authorization?: string | null; cookie?: string | null; csrf?: string | null };

export type KbDatasetsDeps = {
  db: Db;
  audit: AuditService;
  org: { mayRead(viewer: Viewer, owner: string | null): Promise<boolean> };
  train: { storeData(data: string): Promise<{ sha256: string; pairs: number; errorCount: number }> };
};

const createInput = z.object({
  collection: z.string().trim().min(1, "the collection's id"),
  model: z.string().trim().min(1, 'a model (or adapter) name, as /v1 takes it').max(200, 'at most 200 characters'),
  pairsPerChunk: z.number().int('a whole number').min(1, 'at least 1').max(20, 'at most 20').default(3),
  chunkChars: z.number().int('a whole number').min(200, 'at least 200').max(16_000, 'at most 16000').default(1500),
});

/**
 * A RUNNING dataset whose row has not moved for this long lost its server (killed, or its machine gone): it is
 * failed, so no dataset says RUNNING for good. Each chunk moves the row, and one chunk's call is bounded by the
 * gateway's deadline, well under this.
 */
const STALE_MS = 15 * 60_000;

export class KbDatasets {
  private readonly deps: KbDatasetsDeps;
  private baseUrl: () => string = () => {
    throw new Error('KbDatasets: setBaseUrl was not called');
  };
  /** Runs in this process, so a test (and shutdown) can wait for them. */
  private readonly running = new Set<Promise<void>>();
  /** The ids of the datasets this process is writing: a stop fails them, saying so. */
  private readonly mine = new Set<string>();
  private sweeper: NodeJS.Timeout | undefined;
  private stopping = false;

  constructor(deps: KbDatasetsDeps) {
    this.deps = deps;
  }

  /** Where this server listens: the gateway the model is called through. */
  setBaseUrl(url: () => string) {
    this.baseUrl = url;
  }

  /** Fails what a server that went away left RUNNING, now and every minute while this one runs. */
  start() {
    this.sweeper = setInterval(() => void this.sweep().catch(() => {}), 60_000);
    this.sweeper.unref();
    return this.sweep();
  }

  /**
   * RUNNING datasets that stopped moving (their server was killed) are FAILED, with why and what to do. Judged on the
   * database's clock, as each row's progress is written (db/clock.ts): a server whose own clock runs ahead must not
   * fail another server's dataset that moved a minute ago.
   */
  async sweep(now = this.deps.db.clock.nowMs()) {
    const { count } = await this.deps.db.kbDataset.updateMany({
      where: { state: 'RUNNING', updatedAt: { lt: new Date(now - STALE_MS) } },
      data: {
        state: 'FAILED',
        error: 'its server stopped while it ran (no progress for 15 minutes): start the dataset again',
        finishedAt: new Date(now),
      },
    });
    return count;
  }

  /**
   * On shutdown: the datasets this process was writing are FAILED at once, saying the server stopped (their calls
   * to /v1 end with the server), rather than left RUNNING until the sweep of another server finds them.
   */
  async stop() {
    this.stopping = true;
    clearInterval(this.sweeper);
    if (!this.mine.size) return;
    await this.deps.db.kbDataset.updateMany({
      where: { id: { in: [...this.mine] }, state: 'RUNNING' },
      data: {
        state: 'FAILED',
        error: 'the server stopped while it ran: start the dataset again',
        finishedAt: new Date(),
      },
    });
  }

  /** Waits for the datasets this process is writing. */
  async settled() {
    await Promise.all([...this.running]);
  }

  /** A dataset by id, if the viewer may read its collection; null otherwise, as for one that does not exist. */
  async get(viewer: Viewer, id: string): Promise<KbDataset | null> {
    if (!isId(id)) return null;
    const d = await this.deps.db.kbDataset.findUnique({ where: { id }, include: { collection: true } });
    if (!d) return null;
    const owner = ownerKey({ scope: d.collection.ownerScope, id: d.collection.ownerId });
    return (await this.deps.org.mayRead(viewer, owner)) ? d : null;
  }

  /** The dataset whose pairs have this sha256 (a training job's lineage), if the viewer may read its collection. */
  async bySha256(viewer: Viewer, sha256: string): Promise<KbDataset | null> {
    const d = await this.deps.db.kbDataset.findFirst({ where: { dataSha256: sha256 }, orderBy: { createdAt: 'desc' } });
    return d ? this.get(viewer, d.id) : null;
  }

  /** Starts writing pairs from a collection's documents; answers with the row, RUNNING, at once. */
  async create(
    actor: Actor,
    viewer: Viewer,
    credentials: CallerCredentials,
    input: z.input<typeof createInput>,
  ): Promise<Result<KbDataset>> {
    const parsed = parseInput(createInput, input);
    if (!parsed.ok) return parsed;
    const { collection: id, model, pairsPerChunk, chunkChars } = parsed.value;
    const { db } = this.deps;
    const c = isId(id) ? await db.collection.findUnique({ where: { id } }) : null;
    const owner = c ? ownerKey({ scope: c.ownerScope, id: c.ownerId }) : null;
    if (!c || !(await this.deps.org.mayRead(viewer, owner))) {
      return fail(new NotFoundError(`no collection with id ${id} (collections lists those you may read)`));
    }
    const docs = await db.collectionDocument.findMany({ where: { collectionId: c.id }, orderBy: { createdAt: 'asc' } });
    if (!docs.length) {
      return fail(
        new ValidationError(
          'input.collection',
          `input.collection: ${c.name} holds no documents: add some first (addDocument)`,
        ),
      );
    }
    const chunks = chunkDocuments(docs, chunkChars);
    const row = await db.$transaction(async (tx) => {
      const r = await tx.kbDataset.create({
        data: {
          collectionId: c.id,
          model,
          chunks: chunks.length,
          documents: docs.map((d) => ({ id: d.id, name: d.name, sha256: d.sha256 })),
          createdBy: describeActor(actor),
        },
      });
      await this.deps.audit.done(tx, actor, {
        action: 'createDataset',
        target: c.name,
        message: `${docs.length} documents, ${chunks.length} chunks, ${pairsPerChunk} pairs each asked of ${model}`,
        owner,
      });
      return r;
    });
    const run = this.write(row.id, c.id, chunks, credentials, model, pairsPerChunk).catch((err) =>
      this.finish(row.id, { state: 'FAILED', error: `stopped by an error: ${(err as Error).message}` }),
    );
    this.running.add(run);
    this.mine.add(row.id);
    void run.finally(() => {
      this.running.delete(run);
      this.mine.delete(row.id);
    });
    return ok(row);
  }

  private async write(
    id: string,
    collectionId: string,
    chunks: Chunk[],
    credentials: CallerCredentials,
    model: string,
    count: number,
  ) {
    const pairs: Pair[] = [];
    const seen = new Set<string>();
    const notes: string[] = [];
    for (const [i, chunk] of chunks.entries()) {
      const answer = await this.ask(credentials, model, pairPrompt(chunk, count));
      const where = `${chunk.documentName} part ${chunk.index + 1}`;
      if (!answer.ok) {
        // The gateway's refusal (a model the caller may not call, a limit reached) ends the run: later chunks
        // would be refused the same way, or would spend what the limit is there to keep.
        return this.finish(id, { state: 'FAILED', error: `${where}: ${answer.error}`, notes });
      }
      const read = parsePairs(answer.text);
      for (const p of read.pairs) {
        const key = `${p.q}\u0001${p.a}`;
        if (!seen.has(key)) {
          seen.add(key);
          pairs.push(p);
        }
      }
      for (const n of read.notes) notes.push(`${where}: ${n}`);
      await this.deps.db.kbDataset.update({
        where: { id },
        data: { chunksDone: i + 1, pairs: pairs.length, notes, updatedAt: this.deps.db.clock.now() },
      });
    }
    if (!pairs.length) {
      return this.finish(id, { state: 'FAILED', error: `no pairs could be read from ${model}'s answers`, notes });
    }
    const stored = await this.deps.train.storeData(pairsNdjson(pairs, collectionId));
    if (stored.errorCount > 0) {
      return this.finish(id, { state: 'FAILED', error: 'the pairs did not pass the training data check', notes });
    }
    return this.finish(id, { state: 'DONE', dataSha256: stored.sha256, notes });
  }

  private async finish(
    id: string,
    end: { state: 'DONE' | 'FAILED'; error?: string; dataSha256?: string; notes?: string[] },
  ): Promise<void> {
    // Once stopping, the row says the server stopped (stop() wrote it); a call cut by the stop is not the model's fault.
    if (this.stopping) return;
    await this.deps.db.kbDataset.update({ where: { id }, data: { ...end, finishedAt: new Date() } });
  }

  /** One chat completion through this server's /v1, as the caller; the answer's text, or the gateway's refusal. */
  private async ask(
    credentials: CallerCredentials,
    model: string,
    messages: { role: string; content: string }[],
  ): Promise<{ ok: true; text: string } | { ok: false; error: string }> {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (credentials.authorization) headers.authorization = credentials.authorization;
    if (credentials.cookie) headers.cookie = credentials.cookie;
    if (credentials.csrf) headers['x-hangar-csrf'] = credentials.csrf;
    const res = await fetch(`${this.baseUrl()}/v1/chat/completions`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ model, messages, stream: true, temperature: 0.3 }),
    });
    const body = await res.text();
    if (!res.ok) {
      let message = body.slice(0, 300);
      try {
        message = (JSON.parse(body) as { error?: { message?: string } }).error?.message ?? message;
      } catch {}
      return { ok: false, error: `the gateway answered ${res.status}: ${message}` };
    }
    if (!(res.headers.get('content-type') ?? '').includes('event-stream')) {
      try {
        const json = JSON.parse(body) as { choices?: { message?: { content?: string } }[] };
        return { ok: true, text: json.choices?.[0]?.message?.content ?? '' };
      } catch {
        return { ok: false, error: 'the answer was neither a stream nor JSON' };
      }
    }
    let text = '';
    for (const line of body.split('\n')) {
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') break;
      try {
        const chunk = JSON.parse(data) as {
          choices?: { delta?: { content?: string } }[];
          error?: { message?: string };
        };
        if (chunk.error) return { ok: false, error: `the model failed mid-answer: ${chunk.error.message ?? data}` };
        text += chunk.choices?.[0]?.delta?.content ?? '';
      } catch {}
    }
    return { ok: true, text };
  }
}
