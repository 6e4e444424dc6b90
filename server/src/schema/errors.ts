import {
  ConflictError,
  ForbiddenError,
  type HangarError,
  NotFoundError,
  RegistryOffError,
  TooManyAttemptsError,
  UnauthenticatedError,
  UnloadableError,
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
builder.objectType(UnloadableError, {
  name: 'UnloadableError',
  description:
    "Read before the download: the file's GGUF header says the nodes' llama.cpp cannot load it. `field` names the source (sources.0.url), `reason` says why; fetchAnyway takes it regardless.",
  interfaces: [ErrorInterface],
  isTypeOf: (v) => v instanceof UnloadableError,
  fields: (t) => ({ field: t.exposeString('field'), file: t.exposeString('file'), reason: t.exposeString('reason') }),
});
plain(RegistryOffError, 'RegistryOffError', 'The registry explorer is turned off on this server (HANGAR_HUB_URL=off).');
