import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { FetchForm, FetchForm_FetchMutation } from './fetch-form';

const reason = 'llama.cpp (up to b7000) has no architecture named wobble';
const URL_1 = 'http://files.internal/wobble-Q4_K_M.gguf';

function version(model: string, v: string) {
  return {
    __typename: 'MirrorVersion',
    id: `${model}/${v}`,
    model,
    version: v,
    state: 'QUEUED',
    removed: false,
    fileCount: 1,
    files: [],
    bytesDone: 0,
    bytesTotal: null,
    percent: null,
    bytesPerSecond: null,
    etaSeconds: null,
    retry: null,
    error: null,
    verified: false,
    url: null,
    usedBy: [],
    kind: 'MODEL',
    architecture: null,
    updatedAt: '2026-12-01T12:00:00.000Z',
  };
}

function renderForm() {
  const fake = fakeClient([
    answer(FetchForm_FetchMutation, ({ model, version: v, fetchAnyway }) =>
      fetchAnyway
        ? {
            fetchToMirror: {
              __typename: 'FetchStarted',
              message: `started fetching 1 file into ${model}/${v}`,
              started: 1,
              alreadyArriving: 0,
              alreadyPresent: 0,
              version: version(model, v),
            },
          }
        : {
            fetchToMirror: {
              __typename: 'UnloadableError',
              code: 'UNLOADABLE',
              field: 'sources.0.url',
              file: 'wobble-Q4_K_M.gguf',
              reason,
              message: `not fetched: wobble-Q4_K_M.gguf: ${reason}. Its header was read before the download; fetch it anyway with fetchAnyway: true`,
            },
          },
    ),
  ]);
  render(
    <Provider value={fake.client}>
      <h2 id="t">Fetch by URL</h2>
      <FetchForm titleId="t" />
    </Provider>,
  );
  return fake;
}

describe('the Fetch by URL form', () => {
  it('shows the header verdict, and fetches anyway only when that is chosen', async () => {
    const fake = renderForm();
    const user = userEvent.setup();
    await user.type(screen.getByLabelText('Model'), 'wobble');
    await user.type(screen.getByLabelText('Version'), 'v1');
    await user.type(screen.getByLabelText('Source URL'), URL_1);
    await user.click(screen.getByRole('button', { name: 'Start fetching' }));

    const verdict = await screen.findByRole('alert');
    expect(verdict).toHaveTextContent(`Not fetched: wobble-Q4_K_M.gguf cannot be served here. ${reason}.`);
    expect(verdict).toHaveTextContent('Read from its header before any download.');
    // Not the same button pressed twice: a labelled choice, then the button says what it will do.
    const anyway = screen.getByLabelText('Fetch anyway, although the nodes cannot load it');
    expect(anyway).not.toBeChecked();
    expect(screen.queryByRole('button', { name: 'Fetch anyway' })).toBeNull();
    await user.click(anyway);
    await user.click(screen.getByRole('button', { name: 'Fetch anyway' }));

    expect(await screen.findByRole('status')).toHaveTextContent('started fetching 1 file into wobble/v1');
    expect(screen.queryByRole('alert')).toBeNull();
    expect(fake.sent(FetchForm_FetchMutation).map((op) => op.variables.fetchAnyway)).toEqual([false, true]);
    // The choice does not outlive its fetch.
    expect(screen.getByRole('button', { name: 'Start fetching' })).toBeVisible();
  });

  it('forgets the verdict and the choice once the URL changes', async () => {
    renderForm();
    const user = userEvent.setup();
    await user.type(screen.getByLabelText('Model'), 'wobble');
    await user.type(screen.getByLabelText('Version'), 'v1');
    await user.type(screen.getByLabelText('Source URL'), URL_1);
    await user.click(screen.getByRole('button', { name: 'Start fetching' }));
    await user.click(await screen.findByLabelText('Fetch anyway, although the nodes cannot load it'));
    await user.type(screen.getByLabelText('Source URL'), '2');
    expect(screen.queryByRole('alert')).toBeNull();
    expect(screen.getByRole('button', { name: 'Start fetching' })).toBeVisible();
  });
});
