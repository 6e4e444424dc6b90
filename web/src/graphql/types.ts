// The schema's enums and scalars as the console sees them (server/schema.graphql is the contract).

import schema from '../generated/schema.json';

export const roles = ['VIEWER', 'OPERATOR', 'ADMIN'] as const;
export type Role = (typeof roles)[number];

export type AuditOutcome = 'DONE' | 'REFUSED' | 'FAILED';

/** A mirror version's state, summed from its files'; QUEUED, FETCHING and VERIFYING count as arriving. */
export type MirrorVersionState = 'QUEUED' | 'FETCHING' | 'VERIFYING' | 'PRESENT' | 'FAILED' | 'CANCELLED' | 'PAUSED';
export type MirrorFileState = MirrorVersionState;
export const arrivingStates: readonly MirrorVersionState[] = ['QUEUED', 'FETCHING', 'VERIFYING'];

/** How a catalog model runs: always (min replicas > 0), on demand (min 0) or stopped (max 0). */
export type ModelMode = 'ALWAYS' | 'ON_DEMAND' | 'STOPPED';

/** A serve job's or a training job's state, and its steps'. */
export const jobStates = ['QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED'] as const;
export type JobState = (typeof jobStates)[number];

/** DateTime: an ISO 8601 string in UTC. */
export type DateTime = string;

/** Bytes: a JSON number, exact up to 2^53. */
export type Bytes = number;

/** Count: requests or tokens summed, a JSON number exact up to 2^53 (past Int's 2^31). */
export type Count = number;

/** What every typed refusal carries (the `Error` interface, plus `field` on ValidationError). */
export type Refusal = {
  __typename:
    | 'ConflictError'
    | 'ForbiddenError'
    | 'NotFoundError'
    | 'RegistryOffError'
    | 'TooManyAttemptsError'
    | 'UnauthenticatedError'
    | 'UnloadableError'
    | 'UpstreamError'
    | 'ValidationError';
  message: string;
  code: string;
  field?: string;
  /** UnloadableError: the file whose header was refused, and why. */
  file?: string;
  reason?: string;
};

/** A mutation's result union: the success type or one of the refusals. */
export type Outcome<Success> = Success | Refusal;

// Read from the schema (every type implementing `Error`), so a refusal type the server adds later, such as
// TooManyAttemptsError, is still shown with its message instead of being taken for a success.
const refusalTypes = new Set<string>(
  (schema.__schema.types as { name: string; possibleTypes?: { name: string }[] }[])
    .find((t) => t.name === 'Error')
    ?.possibleTypes?.map((t) => t.name) ?? [],
);

export function isRefusal(value: { __typename: string } | null | undefined): value is Refusal {
  return Boolean(value && refusalTypes.has(value.__typename));
}
