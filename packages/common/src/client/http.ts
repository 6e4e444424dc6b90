import type { TadaDocumentNode } from 'gql.tada';

// GraphQL over HTTP as Hangar's own clients send it (the CLI, the node agent): one POST to <url>/graphql with
// the bearer token, read back as the GraphQL-over-HTTP answer it is. What an answer means is the caller's: the
// agent tells "not there" (retry) from "answered no" (final), the CLI picks an exit code and says what to do,
// each in its own words. This file only makes the request the same way for both and reads what came back.

/** A GraphQL response body, as far as both clients read it. */
export type GraphqlBody = {
  data?: Record<string, unknown> | null;
  errors?: { message: string; extensions?: { code?: string } }[];
};

export type GraphqlAnswer = {
  status: number;
  headers: Headers;
  /** The body as sent, for a message about an answer that was not GraphQL (a proxy's 502 page, say). */
  text: string;
  /** The body as JSON; undefined when it was not JSON. */
  body: GraphqlBody | undefined;
};

/** No answer came at all: the connection was refused or reset, the name did not resolve, it timed out. */
export class GraphqlUnanswered extends Error {
  override name = 'GraphqlUnanswered';
  constructor(
    /** Why, in the system's words: ECONNREFUSED, ENOTFOUND, the timeout's message. */
    readonly detail: string,
  ) {
    super(detail);
  }
}

export type GraphqlHttpOptions = {
  /** The server's base URL (http[s]://host[:port][/path]), without /graphql. */
  url: string;
  /** Sent as `authorization: Bearer …`; none for a caller that has none yet (login). */
  token?: string;
  /**
   * graphql-js's print, from the caller: this package does not depend on graphql-js, and a document written
   * with fragments is only whole once printed.
   */
  print: (doc: TadaDocumentNode<unknown, unknown>) => string;
  /** Per request, unless the call says otherwise. */
  timeoutMs?: number;
};

export class GraphqlHttp {
  constructor(private readonly o: GraphqlHttpOptions) {}

  /** One operation; throws GraphqlUnanswered when nothing answered, returns whatever did answer. */
  async post<R, V>(
    doc: TadaDocumentNode<R, V>,
    variables: V | undefined,
    call: { headers?: Record<string, string>; timeoutMs?: number } = {},
  ): Promise<GraphqlAnswer> {
    let res: Response;
    try {
      res = await fetch(`${this.o.url}/graphql`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/graphql-response+json, application/json',
          ...(this.o.token ? { authorization: `Bearer ${this.o.token}` } : {}),
          ...call.headers,
        },
        body: JSON.stringify({
          query: this.o.print(doc as TadaDocumentNode<unknown, unknown>),
          variables: variables ?? {},
        }),
        signal: AbortSignal.timeout(call.timeoutMs ?? this.o.timeoutMs ?? 30_000),
      });
    } catch (err) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      throw new GraphqlUnanswered(cause?.code ?? cause?.message ?? (err as Error).message);
    }
    const text = await res.text().catch(() => '');
    let body: GraphqlBody | undefined;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    return { status: res.status, headers: res.headers, text, body };
  }
}
