import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import type { Viewer } from '../auth/viewer.js';
import type { Db, Tx } from '../db/client.js';
import type { Collection, CollectionDocument } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { PDF_LIMITS, type PdfLimits } from './kb-pdf.js';
import { documentText, kindOf } from './kb-text.js';
import { isId } from './org-lookup.js';
import { ownerKey } from './org-owners.js';

// The documents a knowledge-base collection holds. Whoever may read the collection (OrgReads.mayRead: a session
// as its user, an API token as its own key, admins) reads and changes its documents; anyone else is answered as
// if the collection did not exist, so another team learns neither its documents nor that it is there.

/** `pdf`: the page count and reading time a PDF may take (kb-pdf.ts PDF_LIMITS unless given, as by tests). */
export type KbLimits = {
  documentMaxBytes: number;
  collectionMaxBytes: number;
  pdf?: Partial<Omit<PdfLimits, 'maxTextBytes'>>;
};
export type KbDocumentsDeps = {
  db: Db;
  audit: AuditService;
  org: { mayRead(viewer: Viewer, owner: string | null): Promise<boolean> };
  limits: KbLimits;
};

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

const addInput = z.object({
  collection: z.string().trim().min(1, "the collection's id"),
  name: z
    .string()
    .trim()
    .min(1, 'a file name such as handbook.md')
    .max(200, 'at most 200 characters')
    .refine(
      (s) => !/[/\\]/.test(s) && ![...s].some((ch) => ch.charCodeAt(0) < 0x20),
      'a file name without folders or control characters',
    ),
  contentBase64: z.string().refine((s) => BASE64.test(s.replace(/\s+/g, '')), 'the file, base64-encoded'),
});

const mib = (n: number) =>
  n < 1024 ? `${n} bytes` : n < 1024 * 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1024 / 1024).toFixed(1)} MiB`;

export class KbDocuments {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly org: KbDocumentsDeps['org'];
  private readonly limits: KbLimits;

  constructor({ db, audit, org, limits }: KbDocumentsDeps) {
    this.db = db;
    this.audit = audit;
    this.org = org;
    this.limits = limits;
  }

  private mayRead(viewer: Viewer, c: Pick<Collection, 'ownerScope' | 'ownerId'>): Promise<boolean> {
    return this.org.mayRead(viewer, ownerKey({ scope: c.ownerScope, id: c.ownerId }));
  }

  /** A collection's documents, oldest first; null when the viewer may not read the collection. */
  async list(viewer: Viewer, collection: Collection): Promise<CollectionDocument[] | null> {
    if (!(await this.mayRead(viewer, collection))) return null;
    return this.db.collectionDocument.findMany({
      where: { collectionId: collection.id },
      orderBy: [{ createdAt: 'asc' }, { name: 'asc' }],
    });
  }

  /** One document with its collection; null when there is none or the viewer may not read its collection. */
  async get(viewer: Viewer, id: string): Promise<(CollectionDocument & { collection: Collection }) | null> {
    if (!isId(id)) return null;
    const d = await this.db.collectionDocument.findUnique({ where: { id }, include: { collection: true } });
    return d && (await this.mayRead(viewer, d.collection)) ? d : null;
  }

  /** Adds a document to a collection, refusing what is not text, too large, or over the collection's share. */
  async add(actor: Actor, viewer: Viewer, input: z.input<typeof addInput>): Promise<Result<CollectionDocument>> {
    const parsed = parseInput(addInput, input);
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    const kind = kindOf(name);
    if ('refused' in kind) return fail(new ValidationError('input.name', `input.name: ${kind.refused}`));
    const b64 = parsed.value.contentBase64.replace(/\s+/g, '');
    // Checked before decoding: base64 is 4 characters for every 3 bytes.
    const { documentMaxBytes, collectionMaxBytes } = this.limits;
    const size = Math.floor((b64.length * 3) / 4) - (b64.endsWith('==') ? 2 : b64.endsWith('=') ? 1 : 0);
    if (size > documentMaxBytes) {
      return fail(
        new ValidationError(
          'input.contentBase64',
          `input.contentBase64: ${name} is ${mib(size)}; a document may be at most ${mib(documentMaxBytes)} (HANGAR_KB_DOCUMENT_MAX_BYTES). Split it into smaller documents`,
        ),
      );
    }
    const bytes = Buffer.from(b64, 'base64');
    if (bytes.length === 0) {
      return fail(new ValidationError('input.contentBase64', `input.contentBase64: ${name} is empty`));
    }
    const read = await documentText(name, kind.kind, bytes, {
      ...PDF_LIMITS,
      ...this.limits.pdf,
      // A PDF's text may be as large as a text document: no larger, however well its streams compress.
      maxTextBytes: documentMaxBytes,
    });
    if ('refused' in read)
      return fail(new ValidationError('input.contentBase64', `input.contentBase64: ${read.refused}`));

    return this.db.$transaction(async (tx) => {
      const c = await this.lockedCollection(tx, viewer, parsed.value.collection);
      if (!c.ok) return c;
      const collection = c.value;
      const held = await tx.collectionDocument.aggregate({
        where: { collectionId: collection.id },
        _sum: { bytes: true },
      });
      const used = held._sum.bytes ?? 0;
      if (used + bytes.length > collectionMaxBytes) {
        return fail(
          new ValidationError(
            'input.contentBase64',
            `input.contentBase64: collection ${collection.name} holds ${mib(used)} of its ${mib(collectionMaxBytes)} (HANGAR_KB_COLLECTION_MAX_BYTES); ${name} (${mib(bytes.length)}) does not fit. Remove documents first, or ask an operator to raise the limit`,
          ),
        );
      }
      if (
        await tx.collectionDocument.findUnique({ where: { collectionId_name: { collectionId: collection.id, name } } })
      ) {
        return fail(
          new ConflictError(
            `collection ${collection.name} already has a document ${name}: remove it first to replace it`,
          ),
        );
      }
      const doc = await tx.collectionDocument.create({
        data: {
          collectionId: collection.id,
          name,
          mediaType: read.kind,
          bytes: bytes.length,
          sha256: createHash('sha256').update(bytes).digest('hex'),
          text: read.text,
        },
      });
      await this.audit.done(tx, actor, {
        action: 'addDocument',
        target: `${collection.name}/${name}`,
        message: `${kind.kind}, ${bytes.length} bytes`,
        // The row names the collection's document: only those who may read the collection see it.
        owner: ownerKey({ scope: collection.ownerScope, id: collection.ownerId }),
      });
      return ok(doc);
    });
  }

  /** Removes a document; answers with the collection it was in. */
  async remove(actor: Actor, viewer: Viewer, id: string): Promise<Result<Collection>> {
    return this.db.$transaction(async (tx) => {
      const d = isId(id) ? await tx.collectionDocument.findUnique({ where: { id } }) : null;
      if (!d) return fail(new NotFoundError(`no document with id ${id}`));
      const c = await this.lockedCollection(tx, viewer, d.collectionId);
      // Someone who may not read the collection is told what they would be told of a document that does not exist.
      if (!c.ok) return fail(new NotFoundError(`no document with id ${id}`));
      await tx.collectionDocument.delete({ where: { id } });
      await this.audit.done(tx, actor, {
        action: 'removeDocument',
        target: `${c.value.name}/${d.name}`,
        owner: ownerKey({ scope: c.value.ownerScope, id: c.value.ownerId }),
      });
      return ok(c.value);
    });
  }

  /**
   * The collection, locked for the rest of the transaction (two uploads at once cannot both fit in the room one
   * has left), or the refusal a caller who may not read it gets: the same as for one that does not exist.
   */
  private async lockedCollection(tx: Tx, viewer: Viewer, id: string): Promise<Result<Collection>> {
    const missing = () => fail(new NotFoundError(`no collection with id ${id} (collections lists those you may read)`));
    if (!isId(id)) return missing();
    await tx.$queryRaw`SELECT id FROM "Collection" WHERE id = ${id}::uuid FOR UPDATE`;
    const c = await tx.collection.findUnique({ where: { id } });
    if (!c || !(await this.mayRead(viewer, c))) return missing();
    return ok(c);
  }
}
