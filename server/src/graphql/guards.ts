import { type DocumentNode, GraphQLError, Kind, type ValueNode, visit } from 'graphql';
import type { Plugin } from 'graphql-yoga';
import type { Viewer } from '../auth/viewer.js';
import { nulPath } from '../lib/validate.js';

// Checks made per request, at execution, on the document Yoga has already parsed and validated. Not validation
// rules: Yoga caches validation per document, whoever sent it, so a rule that depends on the caller would hand
// one caller's answer to the next.

/** Whether a document asks for the schema itself (__schema, __type): its shape is for signed-in callers only. */
const introspects = new WeakMap<DocumentNode, boolean>();
function asksForSchema(document: DocumentNode): boolean {
  let found = introspects.get(document);
  if (found === undefined) {
    found = false;
    visit(document, {
      Field(node) {
        if (node.name.value === '__schema' || node.name.value === '__type') found = true;
      },
    });
    introspects.set(document, found);
  }
  return found;
}

/** The first argument written into the document whose string holds a NUL, as `field.argument[.path]`. */
const literalNuls = new WeakMap<DocumentNode, string | null>();
function nulInLiterals(document: DocumentNode): string | null {
  let found = literalNuls.get(document);
  if (found === undefined) {
    found = null;
    const fields: string[] = [];
    visit(document, {
      Field: { enter: (n) => void fields.push(n.name.value), leave: () => void fields.pop() },
      Argument(n) {
        if (found !== null) return;
        const inner = nulInValue(n.value);
        if (inner !== null) found = [fields.at(-1) ?? '', n.name.value, inner].filter(Boolean).join('.');
      },
    });
    literalNuls.set(document, found);
  }
  return found;
}

function nulInValue(v: ValueNode): string | null {
  if (v.kind === Kind.STRING) return v.value.includes('\u0000') ? '' : null;
  if (v.kind === Kind.LIST) {
    for (const [i, item] of v.values.entries()) {
      const inner = nulInValue(item);
      if (inner !== null) return [String(i), inner].filter(Boolean).join('.');
    }
  }
  if (v.kind === Kind.OBJECT) {
    for (const f of v.fields) {
      const inner = nulInValue(f.value);
      if (inner !== null) return [f.name.value, inner].filter(Boolean).join('.');
    }
  }
  return null;
}

type Args = { document: DocumentNode; variableValues?: Record<string, unknown> | null; contextValue: unknown };

function refusal(args: Args): GraphQLError | undefined {
  const viewer = (args.contextValue as { viewer?: Viewer }).viewer;
  if ((!viewer || viewer.kind === 'anonymous') && asksForSchema(args.document)) {
    return new GraphQLError(
      'introspection (__schema, __type) is for signed-in callers: sign in to the console, or send "Authorization: Bearer <token>" with an API token',
      { extensions: { code: 'UNAUTHENTICATED' } },
    );
  }
  // PostgreSQL cannot store U+0000 in text, so a NUL that reached a query would fail it as an unexpected error.
  const field = nulInLiterals(args.document) ?? variablePath(args.variableValues);
  if (field !== null) {
    return new GraphQLError(
      `${field}: a NUL character (U+0000) is not accepted in any text; remove it and send the request again`,
      { extensions: { code: 'BAD_USER_INPUT', field } },
    );
  }
  return undefined;
}

function variablePath(variables: Record<string, unknown> | null | undefined): string | null {
  const inner = variables ? nulPath(variables) : null;
  return inner === null ? null : `$${inner}`;
}

/** Refuses introspection to anonymous callers and NUL characters in any argument, over HTTP and WebSocket. */
export const requestGuards: Plugin = {
  onExecute({ args, setResultAndStopExecution }) {
    const error = refusal(args as Args);
    if (error) setResultAndStopExecution({ errors: [error] });
  },
  onSubscribe({ args, setResultAndStopExecution }) {
    const error = refusal(args as Args);
    if (error) setResultAndStopExecution({ errors: [error] });
  },
};
