import type { CombinedError } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { fieldLabel, readableRefusal } from '../../lib/format';

/** Spread into every mutation's result union: the refusal an operator reads, and the field it names. */
export const FormError_RefusalFragment = graphql(`
  fragment FormError_Refusal on Error {
    message
    code
    ... on ValidationError {
      field
    }
  }
`);

/**
 * Why a form was refused, next to the form, in the server's own words (they are written for operators).
 * A transport or GraphQL error (server down, session ended) is shown the same way.
 */
export function FormError({ refusal, error }: { refusal?: Refusal | null; error?: CombinedError | null }) {
  const message = refusal?.message ?? describeError(error);
  if (!message) return null;
  // Most server messages already start with the field they name ("sources.0.url: an absolute URL"): not twice,
  // and named as a person reads it ("Source 1 URL: an absolute URL"), not as the GraphQL path.
  const field = refusal?.__typename === 'ValidationError' ? refusal.field : undefined;
  return (
    <p role="alert" className="form-error">
      {field && !message.startsWith(`${field}:`) ? (
        <span className="form-error-field">{fieldLabel(field)}: </span>
      ) : null}
      {readableRefusal(message)}
    </p>
  );
}

/**
 * The field a refusal names ("name", "sources.0.url", "params.rank"), when it is a ValidationError: the form shows
 * the message at that field, and FormError under the form only when no field of the form is it.
 */
export function refusedField(refusal: Refusal | null | undefined): string | undefined {
  return refusal?.__typename === 'ValidationError' ? (refusal.field ?? undefined) : undefined;
}

export function describeError(error: CombinedError | null | undefined): string | undefined {
  if (!error) return undefined;
  if (error.networkError) return `Could not reach the Hangar server: ${error.networkError.message}`;
  return error.graphQLErrors.map((e) => e.message).join('; ') || error.message;
}
