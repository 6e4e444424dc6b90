import { useState } from 'react';
import { type CombinedError, useClient, useQuery } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { InlineConfirm } from '../common/confirm-dialog';
import { FormError, FormError_RefusalFragment } from '../common/form-error';

// The documents a knowledge-base collection holds, listed under the collection on the Organisations page, with an
// upload and a Remove for admins. The server decides what an upload may be (its kind, UTF-8, size limits) and says
// why it refuses; the console sends the file's bytes as they are, so that refusal is about the real file.

export const CollectionDocuments_ListQuery = graphql(`
  query CollectionDocuments_List($org: String!) {
    collections(org: $org) { id documents { id name bytes mediaType } }
  }
`);

export const CollectionDocuments_AddMutation = graphql(
  `mutation CollectionDocuments_Add($input: AddDocumentInput!) {
    addDocument(input: $input) { __typename ...FormError_Refusal ... on CollectionDocument { id name bytes mediaType } }
  }`,
  [FormError_RefusalFragment],
);

export const CollectionDocuments_RemoveMutation = graphql(
  `mutation CollectionDocuments_Remove($id: ID!) {
    removeDocument(id: $id) { __typename ...FormError_Refusal ... on Collection { id documents { id name bytes mediaType } } }
  }`,
  [FormError_RefusalFragment],
);

const KIND: Record<string, string> = {
  'text/plain': 'text',
  'text/markdown': 'Markdown',
  'text/html': 'HTML',
  'application/pdf': 'PDF',
};

/** Bytes as a person reads a file's size. */
function size(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

/** The file's bytes, base64-encoded as addDocument takes them (not decoded first: the server checks the UTF-8). */
function readBase64(file: Blob): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onerror = () => reject(reader.error);
    reader.onload = () => {
      const bytes = new Uint8Array(reader.result as ArrayBuffer);
      let binary = '';
      for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
      resolve(btoa(binary));
    };
    reader.readAsArrayBuffer(file);
  });
}

type Problem = { refusal?: Refusal; error?: CombinedError };

/**
 * The server's refusal without the input field it names ("input.contentBase64: notes.txt holds a NUL byte…"): here
 * the field is the file just chosen, and its name already starts the message.
 */
function aboutTheFile(answer: unknown): Refusal | undefined {
  if (!answer || typeof answer !== 'object' || !('message' in answer)) return undefined;
  const refusal = answer as Refusal;
  if (refusal.__typename !== 'ValidationError') return refusal;
  return { ...refusal, field: undefined, message: refusal.message.replace(/^input\.\w+: /, '') };
}

export function CollectionDocuments({
  org,
  collection,
  admin,
}: {
  org: string;
  collection: { id: string; name: string };
  admin: boolean;
}) {
  const client = useClient();
  const [{ data, error }, reexecute] = useQuery({ query: CollectionDocuments_ListQuery, variables: { org } });
  const [busy, setBusy] = useState(false);
  const [problem, setProblem] = useState<Problem>();
  const [asking, setAsking] = useState<string>();
  const documents = data?.collections.find((k) => k.id === collection.id)?.documents;

  const upload = async (input: HTMLInputElement) => {
    const file = input.files?.[0];
    if (!file) return;
    setBusy(true);
    setProblem(undefined);
    try {
      const contentBase64 = await readBase64(file);
      const r = await client
        .mutation(CollectionDocuments_AddMutation, {
          input: { collection: collection.id, name: file.name, contentBase64 },
        })
        .toPromise();
      const answer = r.data?.addDocument;
      if (r.error || !answer || 'message' in answer) {
        setProblem({ refusal: aboutTheFile(answer), error: r.error });
        return;
      }
      input.value = '';
      // The cached list does not hold the new document yet: read it again from the server.
      reexecute({ requestPolicy: 'network-only' });
    } finally {
      setBusy(false);
    }
  };

  const remove = async (id: string) => {
    setBusy(true);
    setProblem(undefined);
    try {
      const r = await client.mutation(CollectionDocuments_RemoveMutation, { id }).toPromise();
      const answer = r.data?.removeDocument;
      if (r.error || !answer || 'message' in answer) {
        setProblem({ refusal: answer && 'message' in answer ? (answer as Refusal) : undefined, error: r.error });
        return;
      }
      setAsking(undefined);
    } finally {
      setBusy(false);
    }
  };

  return (
    <div className="collection-documents">
      <FormError error={error} />
      {documents === undefined ? null : documents === null ? (
        <p className="muted">Its documents are not yours to read.</p>
      ) : documents.length ? (
        <ul aria-label={`Documents of ${collection.name}`}>
          {documents.map((d) => (
            <li key={d.id}>
              <span className="mono">{d.name}</span>{' '}
              <span className="muted">
                · {size(d.bytes)} · {KIND[d.mediaType] ?? d.mediaType}
              </span>
              {admin ? (
                asking === d.id ? (
                  <InlineConfirm
                    label={`Remove ${d.name}?`}
                    action={`Remove ${d.name}`}
                    busy={busy}
                    onConfirm={() => remove(d.id)}
                    onKeep={() => setAsking(undefined)}
                  >
                    <span className="hint">Its text goes; datasets made afterwards do not use it.</span>
                  </InlineConfirm>
                ) : (
                  <button type="button" className="button small" onClick={() => setAsking(d.id)}>
                    Remove
                  </button>
                )
              ) : null}
            </li>
          ))}
        </ul>
      ) : (
        <p className="muted">No documents.</p>
      )}
      {admin ? (
        <label className="form-row">
          <span>Upload a document (.txt, .md, .html, .pdf) to {collection.name}</span>
          <input
            type="file"
            accept=".txt,.text,.md,.markdown,.html,.htm,.pdf,text/plain,text/markdown,text/html,application/pdf"
            disabled={busy}
            onChange={(e) => upload(e.currentTarget)}
          />
        </label>
      ) : null}
      <FormError refusal={problem?.refusal} error={problem?.error ?? null} />
    </div>
  );
}
