import type { z } from 'zod';
import { fail, ok, type Result, ValidationError } from './errors.js';

/** Parses input at the edge; a refusal names the first bad field (as a dotted path) and what it accepts. */
export function parseInput<S extends z.ZodType>(
  schema: S,
  input: unknown,
  prefix = 'input',
): Result<z.output<S>, ValidationError> {
  const parsed = schema.safeParse(input);
  if (parsed.success) return ok(parsed.data);
  const issue = parsed.error.issues[0];
  const field = [prefix, ...(issue?.path ?? [])].filter((p) => p !== '').join('.');
  return fail(new ValidationError(field, `${field}: ${issue?.message ?? 'not accepted'}`));
}
