import { act, render, screen, within } from '@testing-library/react';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { fakeClient } from '../../test/fake-client';
import { createListScrolling, ListScrollingContext } from './scroll-settle';
import { VersionRow, type VersionRow_Version } from './version-row';

// A version in use by a catalog model the operator may change here: its row has a mode select and a replica count.
const used = {
  __typename: 'MirrorVersion',
  id: 'qwen3-8b/Q4_K_M',
  model: 'qwen3-8b',
  version: 'Q4_K_M',
  state: 'PRESENT',
  removed: false,
  fileCount: 1,
  kind: 'MODEL',
  architecture: null,
  files: [],
  bytesDone: 4 * 1024 ** 3,
  bytesTotal: 4 * 1024 ** 3,
  percent: 100,
  bytesPerSecond: null,
  etaSeconds: null,
  retry: null,
  error: null,
  verified: true,
  url: 'http://hangar.test/mirror/qwen3-8b/Q4_K_M/',
  usedBy: [
    {
      __typename: 'ModelUse',
      name: 'plain-model',
      mode: 'ALWAYS',
      replicas: 2,
      maxReplicas: 2,
      declared: false,
      adapterOf: null,
    },
  ],
  updatedAt: new Date().toISOString(),
} as unknown as VersionRow_Version;

function renderRow(list: ReturnType<typeof createListScrolling>) {
  render(
    <Provider value={fakeClient([])}>
      <ListScrollingContext.Provider value={list}>
        <table>
          <tbody>
            <VersionRow version={used} canChange={true} />
          </tbody>
        </table>
      </ListScrollingContext.Provider>
    </Provider>,
  );
  return screen.getByTestId('version-qwen3-8b/Q4_K_M');
}

describe('a mirror row and the scrolling list', () => {
  it('scrolled into view, shows its mode and replicas in look-alikes, and the controls once the list stops', () => {
    const list = createListScrolling();
    list.set(true);
    const row = renderRow(list);
    // No form control while the list moves (each one that comes in sets Chromium's autofill looking over them all).
    expect(within(row).queryByRole('combobox', { name: 'Mode of plain-model' })).toBeNull();
    expect(within(row).queryByRole('spinbutton', { name: 'Replicas of plain-model' })).toBeNull();
    expect(row.querySelectorAll('select, input')).toHaveLength(0);
    expect(row).toHaveTextContent('used by plain-model');
    expect(row.querySelector('.control-standin.select')).toHaveTextContent('always');
    expect(row.querySelector('.control-standin.replicas-input')).toHaveTextContent('2');

    act(() => list.set(false));
    expect(within(row).getByRole('combobox', { name: 'Mode of plain-model' })).toHaveValue('ALWAYS');
    expect(within(row).getByRole('spinbutton', { name: 'Replicas of plain-model' })).toHaveValue(2);
    expect(row.querySelector('.control-standin')).toBeNull();

    // Once real, the controls stay real through the next scroll: nothing the operator is using is swapped away.
    act(() => list.set(true));
    expect(within(row).getByRole('combobox', { name: 'Mode of plain-model' })).toBeInTheDocument();
  });

  it('in view while the list is still, has its controls at once', () => {
    const row = renderRow(createListScrolling());
    expect(within(row).getByRole('combobox', { name: 'Mode of plain-model' })).toHaveValue('ALWAYS');
    expect(row.querySelector('.control-standin')).toBeNull();
  });
});
