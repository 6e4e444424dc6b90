// The schema's enums and scalars as the console sees them (server/schema.graphql is the contract).

import schema from '../generated/schema.json';
import type { introspection_types } from '../graphql-env.d.ts';

/** One of the schema's enums, from the generated introspection (src/graphql-env.d.ts). */
type Enum<Name extends keyof introspection_types> = introspection_types[Name] extends { enumValues: infer V }
  ? V
  : never;

export type Role = Enum<'Role'>;
// In the order the console offers them (least first); `satisfies` fails tsc when the schema drops or renames one.
export const roles = ['VIEWER', 'OPERATOR', 'ADMIN'] as const satisfies readonly Role[];

export type AuditOutcome = Enum<'AuditOutcome'>;

/** A mirror version's state, summed from its files'; QUEUED, FETCHING and VERIFYING count as arriving. */
export type MirrorVersionState = Enum<'MirrorVersionState'>;
export type MirrorFileState = Enum<'MirrorFileState'>;
export const arrivingStates: readonly MirrorVersionState[] = ['QUEUED', 'FETCHING', 'VERIFYING'];

/** How a catalog model runs: always (min replicas > 0), on demand (min 0) or stopped (max 0). */
export type ModelMode = Enum<'ModelMode'>;

/** A serve job's or a training job's state, and its steps'. */
export type JobState = Enum<'JobState'>;
export const jobStates = ['QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED'] as const satisfies readonly JobState[];

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

/**
 * The members of a generated result union that are refusals: each selects `message` and `code` (through
 * FormError_Refusal), which no success type does. A value typed only by its `__typename` narrows to Refusal.
 */
type RefusalOf<T> = [Extract<T, { code: string; message: string }>] extends [never]
  ? T & Refusal
  : Extract<T, { code: string; message: string }>;

export function isRefusal<T extends { __typename: string }>(value: T | null | undefined): value is RefusalOf<T> {
  return Boolean(value && refusalTypes.has(value.__typename));
}
