import { ConflictError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import { CollectionRef } from './org.schema.js';

// A knowledge base's documents (kb-documents.ts). Every read asks whether the caller may read the collection;
// one who may not gets null, as for a document or collection that does not exist.

export const CollectionDocumentRef = builder.prismaObject('CollectionDocument', {
  description: "A document a knowledge-base collection holds, as text (an HTML page's words, without its markup).",
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    mediaType: t.exposeString('mediaType', {
      description: 'text/plain, text/markdown or text/html: what was uploaded.',
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
      'Adds a text, Markdown or HTML document to a collection the caller may read. Refused: PDF and other kinds, NUL bytes, invalid UTF-8, a document over HANGAR_KB_DOCUMENT_MAX_BYTES, a collection over HANGAR_KB_COLLECTION_MAX_BYTES, a name the collection already has.',
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
