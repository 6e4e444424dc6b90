// Expected failures an operator or a script can act on. Each becomes a typed member of a mutation's result
// union (schema/errors.ts), so clients branch on __typename instead of parsing messages. Anything that is not
// one of these is unexpected: masked as "Unexpected error." and logged with the request id.

const brand = Symbol.for('hangar.error');

export abstract class HangarError extends Error {
  abstract readonly code: string;
  readonly [brand] = true;
  /**
   * Set when the service has written this refusal to the audit log itself, coalesced with the ones like it
   * (sign-in guesses): the audit plugin then adds no row of its own, or a guesser would add one per guess.
   */
  recorded = false;
}

/**
 * Whether a value is one of ours. Not `instanceof`: the errors plugin hands typed errors back behind a proxy
 * whose prototype chain is proxied too, so `instanceof` answers false for them.
 */
export function isHangarError(value: unknown): value is HangarError {
  return typeof value === 'object' && value !== null && (value as { [brand]?: boolean })[brand] === true;
}

/** Bad input: names the field (or the line of an uploaded file) and says what is accepted. */
export class ValidationError extends HangarError {
  readonly code = 'VALIDATION';
  constructor(
    readonly field: string,
    message: string,
  ) {
    super(message);
    this.name = 'ValidationError';
  }
}

export class NotFoundError extends HangarError {
  readonly code = 'NOT_FOUND';
  override name = 'NotFoundError';
}

/** The request is valid but clashes with what exists: a name taken, a version in use, a job still running. */
export class ConflictError extends HangarError {
  readonly code = 'CONFLICT';
  override name = 'ConflictError';
}

/** Signed in, but the role does not allow it. */
export class ForbiddenError extends HangarError {
  readonly code = 'FORBIDDEN';
  override name = 'ForbiddenError';
}

/** Not signed in, or the credentials are wrong, expired or revoked. */
export class UnauthenticatedError extends HangarError {
  readonly code = 'UNAUTHENTICATED';
  override name = 'UnauthenticatedError';
}

/** Too many refused attempts in a while (sign-in guesses): `retryAfterSeconds` says when to try again. */
export class TooManyAttemptsError extends HangarError {
  readonly code = 'TOO_MANY_ATTEMPTS';
  override name = 'TooManyAttemptsError';
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
  ) {
    super(message);
  }
}

/**
 * Well-formed but refused for what it holds: an adapter tar that breaks a rule, say. Apart from ValidationError
 * because sending it again will not help: what made it has to change.
 */
export class UnprocessableError extends HangarError {
  readonly code = 'UNPROCESSABLE';
  override name = 'UnprocessableError';
}

/** Someone else's server (the Hub, a node) failed or is out of reach. */
export class UpstreamError extends HangarError {
  readonly code = 'UPSTREAM';
  override name = 'UpstreamError';
}

/**
 * A file its header says the nodes' llama.cpp cannot load, found before the download (fetchToMirror reads the
 * header first): `field` names the source, `reason` says why; the same call with fetchAnyway takes it regardless.
 */
export class UnloadableError extends HangarError {
  readonly code = 'UNLOADABLE';
  override name = 'UnloadableError';
  constructor(
    message: string,
    readonly field: string,
    readonly file: string,
    readonly reason: string,
  ) {
    super(message);
  }
}

/** The registry explorer is turned off on this server (HANGAR_HUB_URL=off or empty). */
export class RegistryOffError extends HangarError {
  readonly code = 'REGISTRY_OFF';
  override name = 'RegistryOffError';
}

export type Result<T, E extends HangarError = HangarError> = { ok: true; value: T } | { ok: false; error: E };

export const ok = <T>(value: T): { ok: true; value: T } => ({ ok: true, value });
export const fail = <E extends HangarError>(error: E): { ok: false; error: E } => ({ ok: false, error });

/** Resolvers throw the expected error so the errors plugin turns it into the typed result. */
export function unwrap<T>(result: Result<T>): T {
  if (!result.ok) throw result.error;
  return result.value;
}
