import { csrfHeaders } from '../../graphql/csrf';

// The playground's one request: POST /v1/chat/completions through the gateway, as the signed-in user (the session
// cookie and its CSRF header, as the GraphQL client sends them), streamed as OpenAI streams it: server-sent events,
// each `data: {chunk}`, a last chunk with the usage when asked for it, and `data: [DONE]`.

export const CHAT_URL = '/v1/chat/completions';

export type ChatRole = 'system' | 'user' | 'assistant';
export type ChatMessage = { role: ChatRole; content: string };

/** The body the playground sends, and the copied call shows word for word. */
export type ChatRequest = {
  model: string;
  messages: ChatMessage[];
  max_tokens?: number;
  stream: true;
  stream_options: { include_usage: true };
};

export function chatRequest(o: { model: string; messages: ChatMessage[]; maxTokens?: number | null }): ChatRequest {
  return {
    model: o.model,
    messages: o.messages,
    ...(o.maxTokens ? { max_tokens: o.maxTokens } : {}),
    stream: true,
    // Without it the engine sends no token count with a stream, and tokens/s would rest on counted chunks.
    stream_options: { include_usage: true },
  };
}

/**
 * Server-sent events as the WHATWG spec reads them, fed whatever pieces the network delivers: a line may be split
 * anywhere (even between a CR and its LF), an event ends at a blank line, and its `data:` lines are joined with
 * newlines. Only `data` matters to OpenAI's protocol; comments (`: keep-alive`) and other fields are skipped.
 */
export class SseParser {
  private buffer = '';
  private data: string[] = [];

  /** The data of every event completed by this piece, in order. */
  push(piece: string): string[] {
    this.buffer += piece;
    const events: string[] = [];
    let pos = 0;
    for (;;) {
      const lf = this.buffer.indexOf('\n', pos);
      const cr = this.buffer.indexOf('\r', pos);
      const end = cr >= 0 && (lf < 0 || cr < lf) ? cr : lf;
      if (end < 0) break;
      // A CR last in the buffer may be the first half of a CRLF: wait for the next piece to tell.
      if (end === cr && cr === this.buffer.length - 1) break;
      const line = this.buffer.slice(pos, end);
      pos = end + (end === cr && this.buffer[cr + 1] === '\n' ? 2 : 1);
      this.line(line, events);
    }
    this.buffer = this.buffer.slice(pos);
    return events;
  }

  /**
   * What is left when the stream ends. The spec drops an event with no blank line after it; a server that closes
   * right after its last `data: [DONE]` line still meant it, so it is kept.
   */
  finish(): string[] {
    const events: string[] = [];
    const rest = this.buffer.replace(/\r$/, '');
    this.buffer = '';
    if (rest) this.line(rest, events);
    this.line('', events);
    return events;
  }

  private line(line: string, events: string[]) {
    if (line === '') {
      if (this.data.length) events.push(this.data.join('\n'));
      this.data = [];
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') this.data.push(value);
  }
}

/** What the playground shows under an answer: measured as the fleet's smoke test measures a replica. */
export type ChatStats = {
  /** From sending the request to the first piece of text. */
  firstTokenMs: number | null;
  tokens: number;
  /** 'usage': the engine's own count (the last chunk); 'counted': chunks with text, until the usage arrives. */
  tokensFrom: 'usage' | 'counted';
  tokensPerSecond: number | null;
};

/**
 * Tokens per second as the smoke test reckons them (server/src/fleet/smoke.ts), so the playground's figure reads
 * against the one on the replica's card: the tokens after the first over the time after the first token.
 */
export function tokensPerSecond(tokens: number, startedAt: number, firstAt: number | null, now: number) {
  if (firstAt == null || tokens === 0) return null;
  const decodeMs = now - firstAt;
  if (tokens > 1 && decodeMs > 0) return ((tokens - 1) * 1000) / decodeMs;
  return now > startedAt ? (tokens * 1000) / (now - startedAt) : null;
}

export type ChatOutcome =
  | { kind: 'done'; text: string; finishReason: string | null; stats: ChatStats }
  | { kind: 'stopped'; text: string; stats: ChatStats }
  | { kind: 'failed'; text: string; message: string; stats: ChatStats };

/** OpenAI's error shape, `{"error": {"message": …}}`, as the gateway and the engines answer it. */
function errorMessageOf(body: unknown): string | null {
  const error = (body as { error?: unknown } | null)?.error;
  if (typeof error === 'string') return error;
  const message = (error as { message?: unknown } | null | undefined)?.message;
  return typeof message === 'string' && message ? message : null;
}

type Chunk = {
  choices?: { delta?: { content?: string | null }; finish_reason?: string | null }[];
  usage?: { completion_tokens?: number } | null;
};

/**
 * Sends the request and reads the answer as it arrives: `onProgress` gets the text so far and the figures after
 * every piece. Never throws: a refusal, a broken stream and a Stop (the signal) are outcomes, each with the text
 * that had arrived.
 */
export async function streamChat(o: {
  request: ChatRequest;
  signal: AbortSignal;
  onProgress: (text: string, stats: ChatStats) => void;
  fetchImpl?: typeof fetch;
  now?: () => number;
}): Promise<ChatOutcome> {
  const now = o.now ?? (() => performance.now());
  const fetchImpl = o.fetchImpl ?? fetch;
  const startedAt = now();
  let firstAt: number | null = null;
  let text = '';
  let pieces = 0;
  let usageTokens: number | null = null;
  let finishReason: string | null = null;
  const stats = (): ChatStats => {
    const tokens = usageTokens ?? pieces;
    return {
      firstTokenMs: firstAt == null ? null : firstAt - startedAt,
      tokens,
      tokensFrom: usageTokens == null ? 'counted' : 'usage',
      tokensPerSecond: tokensPerSecond(tokens, startedAt, firstAt, now()),
    };
  };
  const failed = (message: string): ChatOutcome => ({ kind: 'failed', text, message, stats: stats() });
  const stopped = (): ChatOutcome => ({ kind: 'stopped', text, stats: stats() });

  let response: Response;
  try {
    response = await fetchImpl(CHAT_URL, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'content-type': 'application/json', accept: 'text/event-stream', ...csrfHeaders() },
      body: JSON.stringify(o.request),
      signal: o.signal,
    });
  } catch (err) {
    if (o.signal.aborted) return stopped();
    return failed(`Could not reach the Hangar server: ${(err as Error).message}`);
  }
  if (!response.ok) {
    const raw = await response.text().catch(() => '');
    let body: unknown = null;
    try {
      body = JSON.parse(raw);
    } catch {
      // Not OpenAI's shape (a proxy's page): the status is all there is to say.
    }
    return failed(errorMessageOf(body) ?? `The server answered ${response.status} ${response.statusText}`.trim());
  }
  const type = response.headers.get('content-type') ?? '';
  if (!type.startsWith('text/event-stream') || !response.body) {
    return failed(
      `The server answered ${type || 'no content type'} instead of a stream of server-sent events (text/event-stream): is ${CHAT_URL} reaching Hangar's gateway?`,
    );
  }

  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  let done = false;
  // One event's data: an outcome when it ends the answer with a failure, null to read on.
  const take = (data: string): ChatOutcome | null => {
    if (data === '[DONE]') {
      done = true;
      return null;
    }
    let chunk: Chunk & { error?: unknown };
    try {
      chunk = JSON.parse(data);
    } catch {
      return failed(`The stream held an event that is not JSON: ${data.slice(0, 120)}`);
    }
    // Mid-stream, OpenAI's servers send a failure as one more event holding its error body.
    if (chunk.error != null)
      return failed(errorMessageOf(chunk) ?? 'The stream ended with an error that says nothing more.');
    const choice = chunk.choices?.[0];
    const piece = choice?.delta?.content;
    if (piece) {
      firstAt ??= now();
      text += piece;
      pieces++;
    }
    if (choice?.finish_reason) finishReason = choice.finish_reason;
    if (typeof chunk.usage?.completion_tokens === 'number') usageTokens = chunk.usage.completion_tokens;
    if (piece || chunk.usage) o.onProgress(text, stats());
    return null;
  };
  try {
    for (;;) {
      const { value, done: ended } = await reader.read();
      const events = ended
        ? [...parser.push(decoder.decode()), ...parser.finish()]
        : parser.push(decoder.decode(value, { stream: true }));
      for (const data of events) {
        if (done) break;
        const outcome = take(data);
        if (outcome) {
          await reader.cancel().catch(() => {});
          return outcome;
        }
      }
      if (done) {
        await reader.cancel().catch(() => {});
        break;
      }
      if (ended) {
        return failed(
          'The answer stopped before the server said it was done (no [DONE]): the replica may have gone away mid-answer.',
        );
      }
    }
  } catch (err) {
    if (o.signal.aborted) return stopped();
    return failed(`The answer broke off: ${(err as Error).message}`);
  }
  return { kind: 'done', text, finishReason, stats: stats() };
}
