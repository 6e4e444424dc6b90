import { type InputHTMLAttributes, type ReactNode, useId } from 'react';
import { atFieldRefusal } from '../../lib/format';

type FieldProps = InputHTMLAttributes<HTMLInputElement> & {
  label: string;
  error?: string;
  /** A line under the input saying what it accepts; the error, when there is one, comes after it. */
  hint?: ReactNode;
  /** On the wrapper; `inputClassName` is the input's own (its width, where the page's stylesheet sets one). */
  className?: string;
  inputClassName?: string;
};

/** A labelled input with the server's refusal under it, tied to it for screen readers. */
export function Field({ label, error, hint, className, inputClassName, ...input }: FieldProps) {
  const id = useId();
  return (
    <div className={`field${className ? ` ${className}` : ''}`}>
      <label htmlFor={id}>{label}</label>
      <input
        id={id}
        className={inputClassName}
        autoComplete="off"
        aria-invalid={error ? true : undefined}
        aria-describedby={describedBy(id, hint, error)}
        {...input}
      />
      <HintAndError id={id} hint={hint} error={error} />
    </div>
  );
}

/** A labelled select with its hint and the refusal under it, as Field does for an input. */
export function SelectField({
  id: givenId,
  label,
  value,
  onChange,
  error,
  hint,
  children,
}: {
  /** Given where something else points at the select; otherwise one of its own. */
  id?: string;
  label: string;
  value: string;
  onChange: (value: string) => void;
  error?: string;
  hint?: ReactNode;
  children: ReactNode;
}) {
  const ownId = useId();
  const id = givenId ?? ownId;
  return (
    <div className="field">
      <label htmlFor={id}>{label}</label>
      <select
        id={id}
        value={value}
        aria-invalid={error ? true : undefined}
        aria-describedby={describedBy(id, hint, error)}
        onChange={(e) => onChange(e.target.value)}
      >
        {children}
      </select>
      <HintAndError id={id} hint={hint} error={error} />
    </div>
  );
}

/**
 * A checkbox with its words in its label (the whole line is the click target), and the refusal under it when the
 * server names it, tied to it for screen readers as Field's is.
 */
export function CheckField({
  label,
  checked,
  onChange,
  error,
  className,
  describedBy: hintId,
}: {
  label: ReactNode;
  checked: boolean;
  onChange: (checked: boolean) => void;
  error?: string;
  /** On the label, beside `check`. */
  className?: string;
  /** The id of a hint elsewhere on the page that explains the choice. */
  describedBy?: string;
}) {
  const id = useId();
  const described = [hintId, error ? `${id}-error` : null].filter(Boolean).join(' ') || undefined;
  return (
    <>
      <label className={`check${className ? ` ${className}` : ''}`} htmlFor={id}>
        <input
          id={id}
          type="checkbox"
          checked={checked}
          aria-invalid={error ? true : undefined}
          aria-describedby={described}
          onChange={(e) => onChange(e.target.checked)}
        />
        {label}
      </label>
      <HintAndError id={id} error={error} />
    </>
  );
}

const describedBy = (id: string, hint: unknown, error: unknown) =>
  [hint ? `${id}-hint` : null, error ? `${id}-error` : null].filter(Boolean).join(' ') || undefined;

/** What is accepted, under the control; and the refusal, when there is one, read out as it appears. */
function HintAndError({ id, hint, error }: { id: string; hint?: ReactNode; error?: ReactNode }) {
  return (
    <>
      {hint ? (
        <p id={`${id}-hint`} className="hint field-hint">
          {hint}
        </p>
      ) : null}
      {error ? (
        <p id={`${id}-error`} role="alert" className="form-error field-error">
          {typeof error === 'string' ? atFieldRefusal(error) : error}
        </p>
      ) : null}
    </>
  );
}
