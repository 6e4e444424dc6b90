import { type InputHTMLAttributes, type ReactNode, useId } from 'react';

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
  id,
  label,
  value,
  onChange,
  error,
  hint,
  children,
}: {
  id: string;
  label: string;
  value: string;
  onChange: (value: string) => void;
  error?: string;
  hint?: ReactNode;
  children: ReactNode;
}) {
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
          {error}
        </p>
      ) : null}
    </>
  );
}
