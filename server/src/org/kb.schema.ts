import { ConflictError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import { TrainJobRef } from '../train/train.types.js';
import { CollectionRef } from './org.schema.js';

// A knowledge base's documents (kb-documents.ts). Every read asks whether the caller may read the collection;
// one who may not gets null, as for a document or collection that does not exist.

export const CollectionDocumentRef = builder.prismaObject('CollectionDocument', {
  description:
    "A document a knowledge-base collection holds, as text (an HTML page's words, without its markup; a PDF's text layer).",
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    mediaType: t.exposeString('mediaType', {
      description: 'text/plain, text/markdown, text/html or application/pdf: what was uploaded.',
    }),
    bytes: t.exposeInt('bytes', { description: "The upload's size in bytes." }),
    sha256: t.exposeString('sha256', { description: "The upload's SHA-256." }),
    text: t.exposeString('text', { description: 'The text Hangar keeps and makes pairs from.' }),
    chars: t.int({ select: { text: true }, resolve: (d) => d.text.length }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
  }),
});

builder.objectField(CollectionRef, 'documents', (t) =>
  t.field({
    type: [CollectionDocumentRef],
    nullable: true,
    description: "The collection's documents, oldest first; null for a caller who may not read the collection.",
    resolve: (c, _args, ctx) => ctx.services.kb.list(ctx.viewer, c),
  }),
);

const AddDocumentInput = builder.inputType('AddDocumentInput', {
  fields: (t) => ({
    collection: t.id({ required: true, description: "The collection's id." }),
    name: t.string({
      required: true,
      description: 'The file name; its ending says what it is: .txt, .md, .markdown, .html or .htm.',
    }),
    contentBase64: t.string({
      required: true,
      description: 'The file, base64-encoded: UTF-8 text with no NUL bytes, within HANGAR_KB_DOCUMENT_MAX_BYTES.',
    }),
  }),
});

builder.queryFields((t) => ({
  collectionDocument: t.field({
    type: CollectionDocumentRef,
    nullable: true,
    description: 'One document, with its text; null when there is none or the caller may not read its collection.',
    authScopes: { viewer: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: (_root, args, ctx) => ctx.services.kb.get(ctx.viewer, String(args.id)),
  }),
}));

builder.mutationFields((t) => ({
  addDocument: t.field({
    type: CollectionDocumentRef,
    description:
      'Adds a text, Markdown, HTML or PDF document to a collection the caller may read. Refused: other kinds, NUL bytes, invalid UTF-8, a PDF that is encrypted, has no text (a scan), is unreadable or too long, a document over HANGAR_KB_DOCUMENT_MAX_BYTES, a collection over HANGAR_KB_COLLECTION_MAX_BYTES, a name the collection already has.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { input: t.arg({ type: AddDocumentInput, required: true }) },
    resolve: async (_root, { input }, ctx) =>
      unwrap(await ctx.services.kb.add(ctx.actor, ctx.viewer, { ...input, collection: String(input.collection) })),
  }),
  removeDocument: t.field({
    type: CollectionRef,
    description: 'Removes a document from its collection; answers with the collection.',
    authScopes: { operator: true },
    errors: { types: [NotFoundError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.kb.remove(ctx.actor, ctx.viewer, String(args.id))),
  }),
}));

// ─── pairs from a collection (kb-datasets.ts) ────────────────────────────────────────────────────────────────────

const KbDatasetDocument = builder
  .objectRef<{ id: string; name: string; sha256: string }>('KbDatasetDocument')
  .implement({
    fields: (t) => ({ id: t.exposeID('id'), name: t.exposeString('name'), sha256: t.exposeString('sha256') }),
  });

export const KbDatasetRef = builder.prismaObject('KbDataset', {
  description:
    "Question/answer pairs a served model wrote from a collection's documents, called through the gateway as the caller who asked. While RUNNING, chunksDone counts the progress; once DONE, dataSha256 is what createTrainJob takes.",
  fields: (t) => ({
    id: t.exposeID('id'),
    collection: t.relation('collection'),
    model: t.exposeString('model'),
    state: t.exposeString('state', { description: 'RUNNING, DONE or FAILED.' }),
    chunks: t.exposeInt('chunks'),
    chunksDone: t.exposeInt('chunksDone'),
    pairs: t.exposeInt('pairs'),
    documents: t.field({
      type: [KbDatasetDocument],
      description: 'The documents it was made from, as they were then.',
      resolve: (d) => d.documents as { id: string; name: string; sha256: string }[],
    }),
    notes: t.exposeStringList('notes', { description: "What could not be read from the model's answers." }),
    error: t.exposeString('error', { nullable: true }),
    dataSha256: t.exposeString('dataSha256', {
      nullable: true,
      description: 'The pairs, kept as training data: createTrainJob(input: { dataSha256 }) takes them.',
    }),
    createdBy: t.exposeString('createdBy'),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    finishedAt: t.expose('finishedAt', { type: 'DateTime', nullable: true }),
  }),
});

builder.objectField(TrainJobRef, 'dataset', (t) =>
  t.field({
    type: KbDatasetRef,
    nullable: true,
    description:
      "Where the job's pairs came from, when createDataset wrote them: the collection, its documents and the model. Null otherwise, or for a caller who may not read that collection.",
    resolve: (job, _args, ctx) => ctx.services.kbDatasets.bySha256(ctx.viewer, job.dataSha256),
  }),
);

const CreateDatasetInput = builder.inputType('CreateDatasetInput', {
  fields: (t) => ({
    collection: t.id({ required: true, description: "The collection's id." }),
    model: t.string({ required: true, description: 'The model (or adapter) that writes the pairs, as /v1 names it.' }),
    pairsPerChunk: t.int({ required: false, description: 'Pairs asked for each passage: 1 to 20 (default 3).' }),
    chunkChars: t.int({
      required: false,
      description: 'The longest passage, in characters: 200 to 16000 (default 1500).',
    }),
  }),
});

builder.queryFields((t) => ({
  kbDataset: t.field({
    type: KbDatasetRef,
    nullable: true,
    description: 'A dataset and its progress; null when there is none or the caller may not read its collection.',
    authScopes: { viewer: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: (_root, args, ctx) => ctx.services.kbDatasets.get(ctx.viewer, String(args.id)),
  }),
}));

builder.mutationFields((t) => ({
  createDataset: t.field({
    type: KbDatasetRef,
    description:
      "Starts writing question/answer pairs from a collection's documents with a served model, called through /v1 as the caller (their access to the model and their limits apply). Answers at once with the dataset, RUNNING: follow it with kbDataset(id).",
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError] },
    args: { input: t.arg({ type: CreateDatasetInput, required: true }) },
    resolve: async (_root, { input }, ctx) =>
      unwrap(
        await ctx.services.kbDatasets.create(
          ctx.actor,
          ctx.viewer,
          {
            authorization: ctx.request.headers.get('authorization'),
            cookie: ctx.request.headers.get('cookie'),
            csrf: ctx.request.headers.get('x-hangar-csrf'),
          },
          {
            collection: String(input.collection),
            model: input.model,
            pairsPerChunk: input.pairsPerChunk ?? undefined,
            chunkChars: input.chunkChars ?? undefined,
          },
        ),
      ),
  }),
}));
