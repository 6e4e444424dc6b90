import type { ServerResponse } from 'node:http';

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
  const body = JSON.stringify(err.body());
  res.writeHead(err.status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    ...err.headers,
  });
  res.end(body);
}
