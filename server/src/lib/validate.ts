import type { z } from 'zod';
import { fail, ok, type Result, ValidationError } from './errors.js';

/** Parses input at the edge; a refusal names the first bad field (as a dotted path) and what it accepts. */
export function parseInput<S extends z.ZodType>(
  schema: S,
  input: unknown,
  prefix = 'input',
): Result<z.output<S>, ValidationError> {
  // Before the schema: PostgreSQL cannot store U+0000 in text, so a NUL that got past a loose rule would fail
  // the query as an unexpected error instead of a refusal naming the field.
  const nul = nulPath(input);
  if (nul !== null) {
    const field = [prefix, nul].filter((p) => p !== '').join('.') || prefix || 'input';
    return fail(new ValidationError(field, `${field}: a NUL character (U+0000) is not accepted in any text`));
  }
  const parsed = schema.safeParse(input);
  if (parsed.success) return ok(parsed.data);
  const issue = parsed.error.issues[0];
  const field = [prefix, ...(issue?.path ?? [])].filter((p) => p !== '').join('.');
  return fail(new ValidationError(field, `${field}: ${issue?.message ?? 'not accepted'}`));
}

/** Where a NUL character sits in a value (a dotted path, '' for the value itself), or null when there is none. */
export function nulPath(value: unknown, depth = 0): string | null {
  if (typeof value === 'string') return value.includes('\u0000') ? '' : null;
  if (depth > 32 || typeof value !== 'object' || value === null || ArrayBuffer.isView(value)) return null;
  for (const [key, v] of Array.isArray(value) ? value.entries() : Object.entries(value)) {
    const inner = nulPath(v, depth + 1);
    if (inner !== null) return [String(key), inner].filter((p) => p !== '').join('.');
  }
  return null;
}
