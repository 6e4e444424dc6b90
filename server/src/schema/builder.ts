import SchemaBuilder from '@pothos/core';
import ErrorsPlugin from '@pothos/plugin-errors';
import PrismaPlugin from '@pothos/plugin-prisma';
import ScopeAuthPlugin, { type AuthFailure, AuthScopeFailureType } from '@pothos/plugin-scope-auth';
import { roleAtLeast, viewerRole } from '../auth/viewer.js';
import type { Context } from '../context.js';
import type PrismaTypes from '../generated/pothos-types.js';
import { getDatamodel } from '../generated/pothos-types.js';
import { ForbiddenError, UnauthenticatedError } from '../lib/errors.js';
import './audit-plugin.js';

// Configures the builder and defines no types. Plugin order matters: each plugin wraps the ones after it.
// - audit first, so it sees every mutation's final outcome: a typed refusal, an auth refusal, or a crash.
// - errors before scope-auth, so a refusal by scope-auth becomes a typed ForbiddenError / UnauthenticatedError
//   result that scripts can branch on, rather than a top-level GraphQL error.
// - prisma last: it only shapes queries.
export const builder = new SchemaBuilder<{
  Context: Context;
  PrismaTypes: PrismaTypes;
  AuthScopes: { viewer: boolean; operator: boolean; admin: boolean; node: boolean };
  Scalars: {
    // Sizes are bytes; GraphQL's Int is 32 bits, so they travel as JSON numbers exact to 2^53.
    Bytes: { Input: number; Output: number | bigint };
    // Requests and tokens summed over a range: past Int's 2^31 on a busy month, exact as JSON numbers to 2^53.
    Count: { Input: number; Output: number | bigint };
    DateTime: { Input: Date; Output: Date };
    JSON: { Input: unknown; Output: unknown };
  };
  DefaultFieldNullability: false;
}>({
  plugins: ['audit', ErrorsPlugin, ScopeAuthPlugin, PrismaPlugin],
  defaultFieldNullability: false,
  errors: {
    // Any mutation can be refused for who is calling; each field adds the errors its own rules produce.
    defaultTypes: [UnauthenticatedError, ForbiddenError],
    directResult: true,
  },
  scopeAuth: {
    authScopes: (ctx) => {
      const role = viewerRole(ctx.viewer);
      return {
        viewer: role !== undefined,
        operator: role !== undefined && roleAtLeast(role, 'OPERATOR'),
        admin: role !== undefined && roleAtLeast(role, 'ADMIN'),
        node: ctx.viewer.kind === 'node',
      };
    },
    unauthorizedError: (_parent, ctx, info, result) => {
      const role = viewerRole(ctx.viewer);
      if (ctx.viewer.kind === 'anonymous') {
        return new UnauthenticatedError(
          ctx.viewer.reason ??
            'not signed in: sign in to the console, or send "Authorization: Bearer <token>" with an API token',
        );
      }
      if (ctx.viewer.kind === 'node') {
        return new ForbiddenError(`${info.fieldName} is not for node agents: a node token only reports its node`);
      }
      const needed = scopeRole[firstScope(result.failure)] ?? 'another';
      return new ForbiddenError(`${info.fieldName} needs the ${needed} role; this caller has ${role}`);
    },
  },
  prisma: {
    client: (ctx) => ctx.prisma,
    dmmf: getDatamodel(),
    exposeDescriptions: false,
    filterConnectionTotalCount: true,
  },
});

/** The scope that failed, for the refusal: scope-auth nests failures under $any / $all. */
function firstScope(failure: AuthFailure): string {
  if (failure.kind === AuthScopeFailureType.AuthScope) return String(failure.scope);
  if ('failures' in failure) {
    for (const f of failure.failures) {
      const s = firstScope(f);
      if (s) return s;
    }
  }
  return '';
}

const scopeRole: Record<string, string> = {
  viewer: 'VIEWER',
  operator: 'OPERATOR',
  admin: 'ADMIN',
  node: 'node agent',
};

builder.queryType({});
builder.mutationType({});
builder.subscriptionType({});
