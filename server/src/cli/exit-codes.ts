// What `hangar` exits with, so a script can branch without reading the message (docs/cli.md lists them).
export const EXIT = {
  /** Done: the command did what it says (a pull whose files are all present, a job that finished). */
  ok: 0,
  /** The work itself failed: a download or job ended FAILED or CANCELLED, or the server hit a bug. */
  failed: 1,
  /** The command line or its input was refused (a bad URL or name): nothing was changed. */
  usage: 2,
  /** Not signed in, or the token was refused or may not do this: `hangar login`, or ask an admin. */
  auth: 3,
  /** What was named does not exist (a model, version, repository or job). */
  notFound: 4,
  /** Refused because of what is there now (a version in use, a job not done yet). */
  conflict: 5,
  /** The server (or, for registry commands, the Hub behind it) did not answer; worth trying again. */
  unreachable: 6,
  /** Ctrl-C: this terminal stopped watching; the work goes on in the server. */
  interrupted: 130,
} as const;

export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** A failure the CLI reports as one line and an exit code, never a stack trace. */
export class CliError extends Error {
  override name = 'CliError';
  constructor(
    message: string,
    readonly exitCode: ExitCode,
    /** The server's typed error (`VALIDATION`, `NOT_FOUND`…) when it was one; --json prints it. */
    readonly code?: string,
  ) {
    super(message);
  }
}

/** The exit code for a typed error's stable `code`. */
export function exitForCode(code: string): ExitCode {
  switch (code) {
    case 'VALIDATION':
    case 'UNLOADABLE':
      return EXIT.usage;
    case 'UNAUTHENTICATED':
    case 'FORBIDDEN':
      return EXIT.auth;
    case 'NOT_FOUND':
      return EXIT.notFound;
    case 'CONFLICT':
    case 'TOO_MANY_ATTEMPTS':
      return EXIT.conflict;
    case 'UPSTREAM':
    case 'REGISTRY_OFF':
      return EXIT.unreachable;
    default:
      return EXIT.failed;
  }
}

/** Throws a result union's typed error (anything with `code` and `message`) as a CliError. */
export function orFail<T extends { __typename: string }>(result: T): Exclude<T, { code: string; message: string }> {
  const r = result as { code?: unknown; message?: unknown };
  if (typeof r.code === 'string' && typeof r.message === 'string')
    throw new CliError(r.message, exitForCode(r.code), r.code);
  return result as Exclude<T, { code: string; message: string }>;
}
