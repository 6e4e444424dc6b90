import type { CombinedError } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';

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
  // Most server messages already start with the field they name ("sources.0.url: an absolute URL"): not twice.
  const field = refusal?.__typename === 'ValidationError' ? refusal.field : undefined;
  return (
    <p role="alert" className="form-error">
      {field && !message.startsWith(`${field}:`) ? <span className="form-error-field">{field}: </span> : null}
      {message}
    </p>
  );
}

export function describeError(error: CombinedError | null | undefined): string | undefined {
  if (!error) return undefined;
  if (error.networkError) return `Could not reach the Hangar server: ${error.networkError.message}`;
  return error.graphQLErrors.map((e) => e.message).join('; ') || error.message;
}
