import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { describe, expect, it, vi } from 'vitest';
import { ConfirmDialog } from './confirm-dialog';

describe('ConfirmDialog', () => {
  const show = (onClose = vi.fn(), onGo = vi.fn()) => {
    render(
      <ConfirmDialog
        title="Delete the job j1?"
        refusal={{
          __typename: 'ConflictError',
          code: 'CONFLICT',
          message: 'the job is still running: cancel it first',
        }}
        onClose={onClose}
        actions={
          <button type="button" onClick={onGo}>
            Delete j1
          </button>
        }
      >
        Its curve is deleted.
      </ConfirmDialog>,
    );
    return { onClose, onGo };
  };

  it('names what it asks about, with what follows and the refusal, and starts on the harmless answer', () => {
    show();
    const dialog = screen.getByRole('alertdialog', { name: 'Delete the job j1?' });
    expect(dialog).toHaveTextContent('Its curve is deleted.');
    expect(screen.getByRole('alert')).toHaveTextContent('the job is still running: cancel it first');
    expect(screen.getByRole('button', { name: 'Keep it' })).toHaveFocus();
  });

  it('Enter right after opening and Escape both keep it; only the action acts', async () => {
    const user = userEvent.setup();
    const { onClose, onGo } = show();
    await user.keyboard('{Enter}');
    expect(onClose).toHaveBeenCalledTimes(1);
    await user.keyboard('{Escape}');
    expect(onClose).toHaveBeenCalledTimes(2);
    expect(onGo).not.toHaveBeenCalled();
    await user.click(screen.getByRole('button', { name: 'Delete j1' }));
    expect(onGo).toHaveBeenCalledTimes(1);
  });
});
