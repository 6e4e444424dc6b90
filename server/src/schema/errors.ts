import {
  ConflictError,
  ForbiddenError,
  type HangarError,
  NotFoundError,
  TooManyAttemptsError,
  UnauthenticatedError,
  UpstreamError,
  ValidationError,
} from '../lib/errors.js';
import { builder } from './builder.js';

// Expected failures as data: every mutation's result is `Payload | SomeError | …`, and every error implements
// `Error`, so a client can always ask `... on Error { message code }` and branch on __typename for details.

export const ErrorInterface = builder.interfaceRef<HangarError>('Error').implement({
  fields: (t) => ({
    message: t.exposeString('message'),
    code: t.exposeString('code', { description: 'A stable code scripts can branch on.' }),
  }),
});

const plain = (cls: new (message: string) => HangarError, name: string, description: string) =>
  builder.objectType(cls, { name, description, interfaces: [ErrorInterface], isTypeOf: (v) => v instanceof cls });

builder.objectType(ValidationError, {
  name: 'ValidationError',
  description:
    'The input was not accepted: `field` names the field (or the line of uploaded data), `message` says what is accepted.',
  interfaces: [ErrorInterface],
  isTypeOf: (v) => v instanceof ValidationError,
  fields: (t) => ({ field: t.exposeString('field') }),
});
builder.objectType(TooManyAttemptsError, {
  name: 'TooManyAttemptsError',
  description: 'Too many refused attempts in a while (sign-in guesses); `retryAfterSeconds` says when to try again.',
  interfaces: [ErrorInterface],
  isTypeOf: (v) => v instanceof TooManyAttemptsError,
  fields: (t) => ({ retryAfterSeconds: t.exposeInt('retryAfterSeconds') }),
});
plain(NotFoundError, 'NotFoundError', 'The thing named does not exist.');
plain(ConflictError, 'ConflictError', 'The request clashes with what exists: a name taken, a version in use.');
plain(ForbiddenError, 'ForbiddenError', "The caller's role does not allow this.");
plain(UnauthenticatedError, 'UnauthenticatedError', 'Not signed in, or the credentials are wrong, expired or revoked.');
plain(UpstreamError, 'UpstreamError', 'Another server (the Hub, a node) failed or could not be reached.');
