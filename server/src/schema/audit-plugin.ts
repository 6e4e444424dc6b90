import SchemaBuilder, { BasePlugin, type PothosOutputFieldConfig, type SchemaTypes } from '@pothos/core';
import type { GraphQLFieldResolver, GraphQLResolveInfo } from 'graphql';
import { ownerNamedBy } from '../audit/owned-target.js';
import type { Context } from '../context.js';
import { isHangarError } from '../lib/errors.js';
import { sees, sightOf } from '../org/visible.js';

// Every mutation, done or refused, leaves an audit event. A mutation that succeeds writes its own, inside the
// transaction that made the change (the service does it, so the record and the change stand or fall together).
// A refusal has no transaction, and it is easy to forget in each service, so it is recorded here, once, for all
// mutations: typed refusals (returned by the errors plugin), auth refusals, and unexpected failures.

declare global {
  export namespace PothosSchemaTypes {
    export interface Plugins<Types extends SchemaTypes> {
      audit: AuditPlugin<Types>;
    }
  }
}

export class AuditPlugin<Types extends SchemaTypes> extends BasePlugin<Types> {
  override wrapResolve(
    resolver: GraphQLFieldResolver<unknown, Types['Context'], object>,
    fieldConfig: PothosOutputFieldConfig<Types>,
  ): GraphQLFieldResolver<unknown, Types['Context'], object> {
    if (fieldConfig.parentType !== 'Mutation') return resolver;
    const action = fieldConfig.name;
    return async (parent, args, context, info) => {
      const ctx = context as unknown as Context;
      const target = describeTarget(args as Record<string, unknown>);
      const owner = () => refusalOwner(ctx, args as Record<string, unknown>, info);
      try {
        const result = await resolver(parent, args, context, info);
        // The errors plugin hands a typed refusal back as the resolved value.
        if (isHangarError(result) && !result.recorded) {
          await ctx.services.audit.refused(ctx.actor, action, target, result.message, await owner());
        }
        return result;
      } catch (err) {
        if (isHangarError(err)) {
          if (!err.recorded) await ctx.services.audit.refused(ctx.actor, action, target, err.message, await owner());
        } else {
          const message = `unexpected error (request ${ctx.requestId})`;
          await ctx.services.audit.failed(ctx.actor, action, target, message, await owner());
        }
        throw err;
      }
    };
  }
}

SchemaBuilder.registerPlugin('audit', AuditPlugin);

/**
 * The owner a refusal's row is filed under: that of the owned thing it names, when the caller may see that thing
 * (a member's refused change is then shown to the team and admins alone). Not when it may not: its answer was the
 * one for a name that does not exist, and its own row vanishing from its audit log would say otherwise.
 */
async function refusalOwner(ctx: Context, args: Record<string, unknown>, info: GraphQLResolveInfo) {
  try {
    const owner = await ownerNamedBy(ctx.prisma, args);
    return owner && sees(await sightOf(ctx, info), owner) ? owner : null;
  } catch {
    // An owner that cannot be read (the database is away) leaves the row everyone's: the refusal still answers.
    return null;
  }
}

// The target of a refused mutation, from its arguments; never a secret (passwords and tokens are not read).
const targetKeys = ['id', 'name', 'email', 'repo', 'model', 'version'];
function describeTarget(args: Record<string, unknown>): string | undefined {
  const sources = [args, args.input as Record<string, unknown> | undefined];
  const parts: string[] = [];
  for (const src of sources) {
    if (!src || typeof src !== 'object') continue;
    // A model and its version read as one name, the way the mirror writes it: qwen3-8b/v1.
    if (typeof src.model === 'string' && typeof src.version === 'string') {
      parts.push(`${src.model}/${src.version}`.slice(0, 200));
    }
    for (const key of targetKeys) {
      const v = src[key];
      if (key === 'model' || key === 'version') {
        if (typeof src.model === 'string' && typeof src.version === 'string') continue;
      }
      if (typeof v === 'string' && v) parts.push(v.slice(0, 200));
    }
  }
  return parts.length ? parts.join(' ') : undefined;
}
