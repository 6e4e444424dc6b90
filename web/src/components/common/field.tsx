import { type InputHTMLAttributes, type ReactNode, useId } from 'react';

type FieldProps = InputHTMLAttributes<HTMLInputElement> & {
  label: string;
  error?: string;
  /** A line under the input saying what it accepts; the error, when there is one, comes after it. */
  hint?: ReactNode;
  className?: string;
};

/** A labelled input with the server's refusal under it, tied to it for screen readers. */
export function Field({ label, error, hint, className, ...input }: FieldProps) {
  const id = useId();
  const described = [hint ? `${id}-hint` : null, error ? `${id}-error` : null].filter(Boolean).join(' ');
  return (
    <div className={`field${className ? ` ${className}` : ''}`}>
      <label htmlFor={id}>{label}</label>
      <input
        id={id}
        autoComplete="off"
        aria-invalid={error ? true : undefined}
        aria-describedby={described || undefined}
        {...input}
      />
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
    </div>
  );
}
