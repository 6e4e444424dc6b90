import type { IncomingMessage, ServerResponse } from 'node:http';

// OpenAI's error body, as both of Hangar's OpenAI-compatible servers answer it (a node's endpoint and the
// gateway): `{"error":{"message","type","param","code"}}` with the status OpenAI uses for it, so the official
// clients raise the same typed errors they raise against OpenAI.

/** OpenAI's error body; `status` is the HTTP status it goes with. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
  body() {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export const invalid = (message: string, param: string | null = null, code: string | null = 'invalid_value') =>
  new ApiError(400, message, 'invalid_request_error', param, code);

/** The one answer for a name that does not exist and for one the caller may not see: nothing tells them apart. */
export const modelNotFound = (model: string) =>
  new ApiError(
    404,
    `The model \`${model}\` does not exist or you do not have access to it.`,
    'invalid_request_error',
    'model',
    'model_not_found',
  );

/** Sends `err`; mid-stream (headers gone), as one last server-sent event, which OpenAI's clients raise. */
export function sendError(res: ServerResponse, err: ApiError) {
  if (res.destroyed) return;
  if (res.headersSent) {
    if (!res.writableEnded) res.end(`data: ${JSON.stringify(err.body())}\n\n`);
    return;
  }
  sendOpenAiJson(res, err.status, err.body(), err.headers);
}

/**
 * The one JSON writer of both OpenAI-compatible servers, for answers and errors alike: OpenAI's content type, and
 * the length, so a client knows it has the whole answer.
 */
export function sendOpenAiJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string | number> = {},
): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

/** OpenAI's words for a body that is not JSON, as both servers answer it. */
export const notJson = () =>
  invalid(
    'We could not parse the JSON body of your request. The OpenAI API expects a JSON payload, such as {"model": "…", "messages": […]}.',
    null,
    null,
  );

/**
 * A request's whole body, capped in size and in time; undefined when it was refused (413, 408: answered through
 * `refuse`, which must not read the rest) or the client went away. `who` names the server in the 413.
 */
export function readBody(
  req: IncomingMessage,
  o: { maxBytes: number; timeoutMs: number; who: string; refuse: (err: ApiError) => void; onTimeout?: () => void },
): Promise<Buffer | undefined> {
  const tooLarge = () =>
    new ApiError(
      413,
      `The request body is larger than ${o.maxBytes} bytes, the most ${o.who} accepts; send a shorter prompt.`,
      'invalid_request_error',
      null,
      'request_too_large',
    );
  if (Number(req.headers['content-length'] ?? Number.NaN) > o.maxBytes) {
    o.refuse(tooLarge());
    return Promise.resolve(undefined);
  }
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (value: Buffer | undefined) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      req.off('data', onData);
      resolve(value);
    };
    // A body that never ends holds nothing for long.
    const timer = setTimeout(() => {
      o.onTimeout?.();
      o.refuse(
        new ApiError(
          408,
          `The request body did not arrive within ${o.timeoutMs} ms; send it whole, promptly.`,
          'invalid_request_error',
          null,
          'request_timeout',
          { 'x-should-retry': 'false' },
        ),
      );
      finish(undefined);
    }, o.timeoutMs);
    timer.unref();
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > o.maxBytes) {
        o.refuse(tooLarge());
        return finish(undefined);
      }
      chunks.push(chunk);
    };
    req.on('data', onData);
    req.once('end', () => finish(Buffer.concat(chunks)));
    req.once('error', () => finish(undefined));
    req.once('close', () => finish(undefined));
  });
}
