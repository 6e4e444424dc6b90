import type { FormEvent, ReactNode } from 'react';

/**
 * A titled panel holding one form (create a user, add a node...): the section is named by its heading, so a screen
 * reader's landmarks list it, and the browser tests find it, by what it is for.
 */
export function FormPanel({ titleId, title, children }: { titleId: string; title: string; children: ReactNode }) {
  return (
    <section className="panel" aria-labelledby={titleId}>
      <h2 id={titleId}>{title}</h2>
      {children}
    </section>
  );
}

/**
 * A control inside its own label, the caption above it: the label names the control with no id to keep unique, for
 * the short uncontrolled forms read with FormData. Field (field.tsx) is the one with a hint and an error under it.
 */
export function LabelledControl({ label, children }: { label: ReactNode; children: ReactNode }) {
  return (
    // biome-ignore lint/a11y/noLabelWithoutControl: the control is the children, inside the label, which names it.
    <label className="field">
      <span>{label}</span>
      {children}
    </label>
  );
}

/** A form's submit button, off while its mutation is under way so a second click does not send it twice. */
export function SubmitButton({
  busy,
  className = 'button primary',
  children,
}: {
  busy: boolean;
  className?: string;
  children: ReactNode;
}) {
  return (
    <button type="submit" className={className} disabled={busy}>
      {children}
    </button>
  );
}

/**
 * A submit handler for an uncontrolled form: the page does not reload, and the handler gets the form's values and
 * the form itself (captured before any await: React clears `currentTarget` once the event is over) to reset it.
 */
export function onFormSubmit(handle: (values: FormData, form: HTMLFormElement) => unknown) {
  return (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const form = event.currentTarget;
    void handle(new FormData(form), form);
  };
}

/** What went wrong with an action in a row or a toolbar, beside its buttons, read out as it appears. */
export function InlineProblem({ problem, inline = true }: { problem: string | undefined; inline?: boolean }) {
  if (!problem) return null;
  return (
    <span role="alert" className={inline ? 'form-error inline' : 'form-error'}>
      {problem}
    </span>
  );
}

/**
 * The button that opens the question before something that cannot be undone (ConfirmDialog, InlineConfirm): red,
 * and announced as opening a dialog, so nothing is removed by this click itself.
 */
export function ConfirmButton({ onClick, children }: { onClick: () => void; children: ReactNode }) {
  return (
    <button type="button" className="button small danger" aria-haspopup="dialog" onClick={onClick}>
      {children}
    </button>
  );
}

/** The button inside a confirmation that does the irreversible thing, off while it is under way. */
export function DangerButton({
  busy,
  small = false,
  onClick,
  children,
}: {
  busy: boolean;
  small?: boolean;
  onClick: () => void;
  children: ReactNode;
}) {
  return (
    <button type="button" className={small ? 'button small danger' : 'button danger'} disabled={busy} onClick={onClick}>
      {children}
    </button>
  );
}
