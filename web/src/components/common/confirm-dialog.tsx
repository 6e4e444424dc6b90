import { type ReactNode, useEffect, useId, useRef } from 'react';
import type { CombinedError } from 'urql';
import type { Refusal } from '../../graphql/types';
import { FormError } from './form-error';

/**
 * Asks before something that cannot be undone: an alertdialog that names it, says what follows, shows the
 * server's refusal, and offers `actions` beside "Keep it". Focus starts on "Keep it", so Enter right after the
 * click that opened it changes nothing; Escape is "Keep it" too.
 */
export function ConfirmDialog({
  title,
  children,
  refusal,
  error,
  actions,
  onClose,
}: {
  title: ReactNode;
  children: ReactNode;
  refusal?: Refusal | null;
  error?: CombinedError | null;
  actions: ReactNode;
  onClose: () => void;
}) {
  const titleId = useId();
  const keepRef = useRef<HTMLButtonElement>(null);
  useEffect(() => keepRef.current?.focus(), []);
  return (
    <div
      role="alertdialog"
      aria-labelledby={titleId}
      className="confirm"
      onKeyDown={(e) => {
        if (e.key === 'Escape') onClose();
      }}
    >
      <p id={titleId} className="confirm-title">
        {title}
      </p>
      <p className="hint">{children}</p>
      <FormError refusal={refusal} error={error} />
      <div className="confirm-actions">
        {actions}
        <button type="button" className="button" ref={keepRef} onClick={onClose}>
          Keep it
        </button>
      </div>
    </div>
  );
}

/**
 * The question asked in place, under a row's buttons, where a dialog would hide the row it is about: a group named
 * for the action, what follows from it, the red button that does it and "Keep it".
 */
export function InlineConfirm({
  label,
  children,
  action,
  busy,
  onConfirm,
  onKeep,
}: {
  label: string;
  children: ReactNode;
  action: ReactNode;
  busy: boolean;
  onConfirm: () => void;
  onKeep: () => void;
}) {
  return (
    <fieldset className="confirm" aria-label={label}>
      {children}
      <div className="confirm-actions">
        <button type="button" className="button small danger" disabled={busy} onClick={onConfirm}>
          {action}
        </button>
        <button type="button" className="button small" onClick={onKeep}>
          Keep it
        </button>
      </div>
    </fieldset>
  );
}
