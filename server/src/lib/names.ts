import { z } from 'zod';

// Names that end up in paths and URLs (models, versions, nodes): no path tricks, nothing a shell or a URL would mangle.
export const resourceName = (what: string) =>
  z
    .string()
    .regex(
      /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/,
      `${what} is letters, digits, '.', '_' and '-', starting with a letter or digit, up to 100 characters`,
    )
    .refine((s) => !s.includes('..'), `${what} may not contain '..'`);
