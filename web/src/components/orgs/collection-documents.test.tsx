import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import {
  CollectionDocuments,
  CollectionDocuments_AddMutation,
  CollectionDocuments_ListQuery,
  CollectionDocuments_RemoveMutation,
} from './collection-documents';

type Doc = { __typename: 'CollectionDocument'; id: string; name: string; bytes: number; mediaType: string };
const doc = (id: string, name: string, bytes: number, mediaType: string): Doc => ({
  __typename: 'CollectionDocument',
  id,
  name,
  bytes,
  mediaType,
});

/** A fake server holding one collection, "manuals", whose documents the mutations change. */
function setup(refuse?: string) {
  let documents: Doc[] = [doc('d1', 'install.md', 2048, 'text/markdown'), doc('d2', 'faq.html', 300, 'text/html')];
  const collection = () => ({ __typename: 'Collection', id: 'k1', documents });
  const fake = fakeClient([
    answer(CollectionDocuments_ListQuery, () => ({ collections: [collection()] })),
    answer(CollectionDocuments_AddMutation, ({ input }) => {
      if (refuse)
        return {
          addDocument: {
            __typename: 'ValidationError',
            message: refuse,
            code: 'VALIDATION',
            field: 'input.contentBase64',
          },
        };
      const added = doc('d3', input.name, atob(input.contentBase64).length, 'text/plain');
      documents = [...documents, added];
      return { addDocument: added };
    }),
    answer(CollectionDocuments_RemoveMutation, ({ id }) => {
      documents = documents.filter((d) => d.id !== id);
      return { removeDocument: collection() };
    }),
  ]);
  render(
    <Provider value={fake.client}>
      <CollectionDocuments org="acme" collection={{ id: 'k1', name: 'manuals' }} admin />
    </Provider>,
  );
  return fake;
}

const items = () =>
  within(screen.getByRole('list', { name: 'Documents of manuals' }))
    .getAllByRole('listitem')
    .map((li) => li.textContent);

describe('CollectionDocuments', () => {
  it('lists each document with its name, size and kind', async () => {
    const fake = setup();
    expect(await screen.findByText('install.md')).toBeInTheDocument();
    expect(items()).toEqual([
      expect.stringMatching(/install\.md · 2\.0 KiB · Markdown/),
      expect.stringMatching(/faq\.html · 300 B · HTML/),
    ]);
    expect(fake.sent(CollectionDocuments_ListQuery)[0]?.variables).toEqual({ org: 'acme' });
  });

  it('uploads a file as addDocument expects (its name and base64 bytes) and lists it', async () => {
    const fake = setup();
    const user = userEvent.setup();
    await screen.findByText('install.md');
    const text = 'Reset the pump: hold the red button.\nÜber alles.\n';
    await user.upload(screen.getByLabelText(/Upload a document/), new File([text], 'pump.txt', { type: 'text/plain' }));
    expect(await screen.findByText('pump.txt')).toBeInTheDocument();
    const sent = fake.sent(CollectionDocuments_AddMutation)[0]?.variables as {
      input: { collection: string; name: string; contentBase64: string };
    };
    expect(sent.input.collection).toBe('k1');
    expect(sent.input.name).toBe('pump.txt');
    const bytes = Uint8Array.from(atob(sent.input.contentBase64), (c) => c.charCodeAt(0));
    expect(new TextDecoder().decode(bytes)).toBe(text);
    expect(screen.queryByRole('alert')).toBeNull();
  });

  it('shows the server’s refusal next to the upload', async () => {
    // The server's words for this file (server/src/org/kb-text.ts).
    const refusal =
      'input.contentBase64: notes.txt holds a NUL byte (at byte 8): it is a binary file, not text. Upload text (.txt), Markdown (.md, .markdown) or HTML (.html, .htm), in UTF-8';
    const fake = setup(refusal);
    const user = userEvent.setup();
    await screen.findByText('install.md');
    await user.upload(screen.getByLabelText(/Upload a document/), new File(['ABCDEFGH\u0000rest'], 'notes.txt'));
    // Shown in the server's words, less the input field it names: the file's name starts the message.
    expect(await screen.findByRole('alert')).toHaveTextContent(
      /^notes\.txt holds a NUL byte \(at byte 8\): it is a binary file/,
    );
    expect(fake.sent(CollectionDocuments_AddMutation)[0]?.variables).toMatchObject({ input: { name: 'notes.txt' } });
    expect(items()).toHaveLength(2);
  });

  it('removes a document only after confirming', async () => {
    const fake = setup();
    const user = userEvent.setup();
    const row = (await screen.findByText('faq.html')).closest('li') as HTMLElement;
    await user.click(within(row).getByRole('button', { name: 'Remove' }));
    const ask = within(row).getByRole('group', { name: 'Remove faq.html?' });
    expect(fake.sent(CollectionDocuments_RemoveMutation)).toHaveLength(0);

    await user.click(within(ask).getByRole('button', { name: 'Keep it' }));
    expect(within(row).queryByRole('group')).toBeNull();
    expect(fake.sent(CollectionDocuments_RemoveMutation)).toHaveLength(0);

    await user.click(within(row).getByRole('button', { name: 'Remove' }));
    await user.click(within(row).getByRole('button', { name: 'Remove faq.html' }));
    await screen.findByText('install.md');
    await expect.poll(() => screen.queryByText('faq.html')).toBeNull();
    expect(fake.sent(CollectionDocuments_RemoveMutation)[0]?.variables).toEqual({ id: 'd2' });
    expect(items()).toHaveLength(1);
  });
});
