import { createSourceEventStream, type DocumentNode, type ExecutionResult, execute, print } from 'graphql';
import { isAsyncIterable, type Plugin } from 'graphql-yoga';
import type { Viewer } from '../auth/viewer.js';
import type { Context } from '../context.js';
import type { PubSub } from '../pubsub.js';

// A subscription event is executed once for every subscriber that would get the same answer, not once by each.
// PubSub.shared already made the database read once per event; what remained at 1000 subscribers was running
// the same selection set over the same object 1000 times (and the garbage of it), which kept an event's delay
// at 1.3× bare Yoga's over WebSocket and 2.8× over SSE (#17). The same answer means: the same event, the same
// document, operation and variables, and the same caller and role, since every field's authorization and
// every visibility rule is decided by those. So one caller's many tabs share, and two callers never do.

/** Who a result may be shared among: undefined for callers whose results are never shared. */
function sharingClass(viewer: Viewer): string | undefined {
  if (viewer.kind === 'user' || viewer.kind === 'token') {
    const callerOnly = viewer.kind === 'token' && viewer.callerOnly ? ' caller-only' : '';
    // A token sees what its user's memberships and its own admit (org-owners.ts callerReach), so two tokens of
    // one user may see different owned things: each token is a caller of its own.
    const who = viewer.kind === 'token' ? `${viewer.user.id} ${viewer.tokenId}` : viewer.user.id;
    return `${viewer.kind} ${who} ${viewer.role}${callerOnly}`;
  }
  if (viewer.kind === 'node') return `node ${viewer.node.id}`;
  return undefined;
}

// Yoga's parser cache hands out one document per query text, so most lookups hit; print() is for the rest.
const documentTexts = new WeakMap<DocumentNode, string>();
function documentText(document: DocumentNode): string {
  let text = documentTexts.get(document);
  if (text === undefined) {
    text = document.loc?.source.body ?? print(document);
    documentTexts.set(document, text);
  }
  return text;
}

export type SharedResultsDeps = {
  pubsub: PubSub;
  /** Told of every event result a subscriber gets: executed for it, or handed over from another's execution. */
  onResult?: (how: 'executed' | 'shared') => void;
};

export function shareSubscriptionResults({ pubsub, onResult }: SharedResultsDeps): Plugin<Context> {
  return {
    onSubscribe({ args, setSubscribeFn }) {
      const who = sharingClass(args.contextValue.viewer);
      if (!who) return;
      const read = `result\0${who}\0${args.operationName ?? ''}\0${JSON.stringify(args.variableValues ?? {})}\0${documentText(args.document)}`;
      setSubscribeFn(async (subscribeArgs) => {
        const source = await createSourceEventStream(subscribeArgs);
        if (!isAsyncIterable(source)) return source;
        return mapEvents(source, (payload) => {
          const run = () => {
            onResult?.('executed');
            return Promise.resolve(execute({ ...subscribeArgs, rootValue: payload }));
          };
          // Events are ids (pubsub.ts); anything else is executed for its subscriber alone.
          if (typeof payload !== 'string') return run();
          let ran = false;
          const result = pubsub.sharedEvent(payload, read, () => {
            ran = true;
            return run();
          });
          if (!ran) onResult?.('shared');
          return result;
        });
      });
    },
  };
}

/** The source's events mapped to results, in order; ending it (the client went) ends the source too. */
function mapEvents<T>(
  source: AsyncIterable<T>,
  toResult: (event: T) => Promise<ExecutionResult>,
): AsyncIterableIterator<ExecutionResult> {
  const events = source[Symbol.asyncIterator]();
  const done = { done: true, value: undefined } as const;
  const iterator: AsyncIterableIterator<ExecutionResult> = {
    [Symbol.asyncIterator]: () => iterator,
    async next() {
      const event = await events.next();
      if (event.done) return done;
      return { done: false, value: await toResult(event.value) };
    },
    async return() {
      await events.return?.();
      return done;
    },
    async throw(error: unknown) {
      await events.return?.();
      throw error;
    },
  };
  return iterator;
}
