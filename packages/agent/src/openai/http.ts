import { randomBytes } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '@hangar/common/log';
import {
  ApiError,
  invalid,
  modelNotFound,
  notJson,
  readBody,
  sendError,
  sendOpenAiJson,
} from '@hangar/common/openai-error';
import { hashSecret, sameSecret } from '@hangar/common/secret-hash';
import { chatBody, completionBody, embeddingBody, parse, samplingOf, streamFields } from './bodies.js';
import { type ChatMessage, EngineError, type Generated, type GenerateInput, type ServedModel } from './engine.js';
import { engineRefusal, eventStream, float32Base64, now, routeOf, send, serverError, usageOf } from './reply.js';

// The agent's OpenAI-compatible endpoint: one listening port per agent, every replica on the node behind it,
// each reachable only with its own engine key. It speaks OpenAI's protocol exactly (routes, bodies, server-sent
// events, error shape and statuses), so the official clients, the gateway and the smoke test need nothing
// Hangar-specific. It knows nothing of llama.cpp: a replica is a ServedModel (engine.ts). What a request body
// may hold is in bodies.ts; routing, JSON replies and server-sent events in reply.ts.

export type OpenAiServerOptions = {
  log: Logger;
  /** A request body larger than this is refused with 413 (default 4 MiB: a long chat is a few hundred KiB). */
  maxBodyBytes?: number;
  /** A body not complete this long after its headers is cut off with 408, so a trickling client holds nothing. */
  bodyTimeoutMs?: number;
};

export type OpenAiServer = {
  /** Makes a replica answer under its catalog name (and its adapters' names), for callers with `engineKey`. */
  serve(model: ServedModel, engineKey: string): void;
  /**
   * New requests for it get 404; a request it is answering runs on, until the model itself stops it. With
   * `model`, that replica alone (a node may run two of one model, one per GPU); without, every one of the name.
   */
  unserve(name: string, model?: ServedModel): void;
  /** Binds the port; resolves to the URL to reach it from this machine (no /v1), e.g. http://127.0.0.1:41234. */
  listen(at: { host: string; port: number }): Promise<string>;
  /** Stops listening, aborts every request being answered (their sequences are freed) and closes the sockets. */
  close(): Promise<void>;
};

const MiB = 1024 * 1024;

type Entry = { model: ServedModel; keyHash: string; created: number; gone: boolean };

// --- The server -----------------------------------------------------------------------------------------------

export function createOpenAiServer(options: OpenAiServerOptions): OpenAiServer {
  const { log } = options;
  const maxBodyBytes = options.maxBodyBytes ?? 4 * MiB;
  const bodyTimeoutMs = options.bodyTimeoutMs ?? 30_000;
  // By replica: two replicas of one model (one per GPU) each answer under their own engine key.
  const served = new Map<ServedModel, Entry>();
  /** Every request being answered, so close() can free their sequences at once. */
  const inFlight = new Set<AbortController>();
  const server = http.createServer({ noDelay: true }, (req, res) => {
    handle(req, res).catch((err) => {
      log.error('the OpenAI endpoint failed to answer a request', { path: req.url?.split('?')[0], err });
      if (!res.headersSent) send(res, serverError());
      else res.destroy();
    });
  });
  // A request line and headers get the same deadline as a body: nobody holds a socket by trickling either.
  server.headersTimeout = Math.min(bodyTimeoutMs, 60_000);

  /** The replicas this bearer key opens: compared against every key, in constant time, no early exit. */
  function entriesFor(req: IncomingMessage): Entry[] {
    const header = req.headers.authorization ?? '';
    const m = header.match(/^Bearer\s+(\S+)\s*$/i);
    if (!m?.[1]) {
      throw new ApiError(
        401,
        "You didn't provide an API key. Give the replica's engine key in an Authorization header: 'Authorization: Bearer <key>'.",
        'invalid_request_error',
        null,
        'invalid_api_key',
      );
    }
    // Hashed first, so every comparison is of equal lengths and takes the same time.
    const given = hashSecret(m[1]);
    const open: Entry[] = [];
    for (const entry of served.values()) if (sameSecret(given, entry.keyHash)) open.push(entry);
    if (!open.length) {
      // The key itself is never echoed (OpenAI shows a masked one) nor logged.
      throw new ApiError(
        401,
        'Incorrect API key provided, or the replica it opened no longer runs on this node. Each replica has its own engine key; the control plane holds it.',
        'invalid_request_error',
        null,
        'invalid_api_key',
      );
    }
    return open;
  }

  /** A request names the base model or one of its adapters (adapter names are unique in the catalog). */
  function resolveModel(open: Entry[], name: string): { entry: Entry; adapter?: string } {
    const base = open.find((e) => e.model.name === name);
    if (base) return { entry: base };
    const withAdapter = open.find((e) => e.model.adapters().includes(name));
    if (withAdapter) return { entry: withAdapter, adapter: name };
    throw modelNotFound(name);
  }

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const path = (req.url ?? '/').split('?')[0] ?? '/';
    const route = routeOf(req.method ?? 'GET', path);
    if (route.kind === 'none') {
      return refuseEarly(req, res, new ApiError(404, `Invalid URL (${req.method} ${path})`, 'invalid_request_error'));
    }
    if (route.kind === 'method') {
      const err = new ApiError(
        405,
        `Invalid method for URL (${req.method} ${path}): use ${route.allow}.`,
        'invalid_request_error',
      );
      return refuseEarly(req, res, err, { allow: route.allow });
    }
    if (route.kind === 'health') return send(res, 200, { status: 'ok' });
    let open: Entry[];
    try {
      // Before the body is read: a caller without a key makes the node read nothing.
      open = entriesFor(req);
    } catch (err) {
      return refuseEarly(req, res, err as ApiError);
    }
    if (route.kind === 'models') return send(res, 200, { object: 'list', data: open.flatMap(modelCards) });
    if (route.kind === 'model') {
      const card = open.flatMap(modelCards).find((c) => c.id === route.id);
      return card ? send(res, 200, card) : send(res, modelNotFound(route.id));
    }
    const raw = await readJson(req, res);
    if (raw === undefined) return;
    const controller = new AbortController();
    const stopWatching = watchClient(res, controller);
    inFlight.add(controller);
    try {
      if (route.kind === 'chat') await chat(res, open, raw, controller.signal);
      else if (route.kind === 'completion') await completion(res, open, raw, controller.signal);
      else await embeddings(res, open, raw, controller.signal);
    } catch (err) {
      if (controller.signal.aborted) return; // the client is gone, or the agent is stopping: nobody to tell
      const answer = err instanceof ApiError ? err : engineRefusal(err);
      if (!answer) log.error('a served model failed a request', { path, err });
      sendError(res, answer ?? serverError());
    } finally {
      inFlight.delete(controller);
      stopWatching();
    }
  }

  function modelCards(entry: Entry) {
    const base = { id: entry.model.name, object: 'model' as const, created: entry.created, owned_by: 'hangar' };
    // Adapters as vLLM lists its LoRA modules: models of their own, with the base they apply to as `parent`.
    const adapters = entry.model
      .adapters()
      .map((id) => ({ id, object: 'model' as const, created: entry.created, owned_by: 'hangar', parent: base.id }));
    return [base, ...adapters];
  }

  /**
   * Aborts `controller` when the caller goes away before the answer ends, so the model frees the sequence at
   * once instead of generating for nobody. A response closed before it finished is a client that reset or shut
   * its socket (Node closes a socket the client half-closes: no half-open HTTP here).
   */
  function watchClient(res: ServerResponse, controller: AbortController) {
    const gone = () => {
      if (!res.writableFinished) controller.abort(new Error('the client went away'));
    };
    res.once('close', gone);
    return () => res.off('close', gone);
  }

  /** The body as JSON, or undefined when it was refused (already answered). Capped in size and in time. */
  async function readJson(req: IncomingMessage, res: ServerResponse): Promise<unknown> {
    const raw = await readBody(req, {
      maxBytes: maxBodyBytes,
      timeoutMs: bodyTimeoutMs,
      who: 'this node',
      refuse: (err) => refuseEarly(req, res, err),
      onTimeout: () =>
        log.warn('cut off a request whose body did not arrive in time', {
          path: req.url?.split('?')[0],
          remote: req.socket.remoteAddress,
          ms: bodyTimeoutMs,
        }),
    });
    if (!raw) return undefined;
    try {
      return JSON.parse(raw.toString('utf8')) as unknown;
    } catch {
      sendError(res, notJson());
      return undefined;
    }
  }

  /**
   * Answers before (or instead of) reading the body, then closes the connection: the unread body must not be
   * read as the next request, nor drained at the sender's pace.
   */
  function refuseEarly(req: IncomingMessage, res: ServerResponse, err: ApiError, headers: Record<string, string> = {}) {
    if (res.headersSent) return req.socket.destroy();
    res.once('finish', () => req.socket.destroy());
    sendOpenAiJson(res, err.status, err.body(), { connection: 'close', ...err.headers, ...headers });
  }

  // --- Routes ---------------------------------------------------------------------------------------------------

  async function chat(res: ServerResponse, open: Entry[], raw: unknown, signal: AbortSignal) {
    const body = parse(chatBody, raw);
    const { stream, includeUsage } = streamFields(body);
    for (const [i, m] of body.messages.entries()) {
      if (m.content == null && m.role !== 'assistant') {
        const param = `messages[${i}].content`;
        throw invalid(`Missing required parameter: '${param}'.`, param, 'missing_required_parameter');
      }
    }
    const { entry, adapter } = resolveModel(open, body.model);
    // Text parts are joined a line apart, as vLLM joins them, before the model's chat template sees them.
    const messages: ChatMessage[] = body.messages.map((m) => ({
      role: m.role,
      content: typeof m.content === 'string' ? m.content : (m.content ?? []).map((p) => p.text).join('\n'),
    }));
    const input: GenerateInput = {
      kind: 'chat',
      messages,
      ...samplingOf(body, body.max_completion_tokens ?? body.max_tokens ?? undefined),
      adapter,
      signal,
    };
    const id = `chatcmpl-${randomBytes(12).toString('hex')}`;
    const head = { id, object: 'chat.completion.chunk', created: now(), model: body.model };
    if (!stream) {
      const out = await generate(entry, input);
      return send(res, 200, {
        id,
        object: 'chat.completion',
        created: head.created,
        model: body.model,
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: out.text, refusal: null },
            logprobs: null,
            finish_reason: out.finishReason,
          },
        ],
        usage: usageOf(out),
      });
    }
    const sse = eventStream(res, includeUsage);
    const out = await sse.run(
      () =>
        sse.chunk({
          ...head,
          choices: [
            { index: 0, delta: { role: 'assistant', content: '', refusal: null }, logprobs: null, finish_reason: null },
          ],
        }),
      (onText) => generate(entry, { ...input, onText }),
      (text) =>
        sse.chunk({ ...head, choices: [{ index: 0, delta: { content: text }, logprobs: null, finish_reason: null }] }),
    );
    if (!out) return;
    sse.chunk({ ...head, choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: out.finishReason }] });
    sse.end({ ...head, choices: [], usage: usageOf(out) });
  }

  async function completion(res: ServerResponse, open: Entry[], raw: unknown, signal: AbortSignal) {
    const body = parse(completionBody, raw);
    const { stream, includeUsage } = streamFields(body);
    const { entry, adapter } = resolveModel(open, body.model);
    const prompt = typeof body.prompt === 'string' ? body.prompt : (body.prompt[0] ?? '');
    // OpenAI's completions default to 16 tokens (chat has no such default): a client relying on it gets the same.
    const input: GenerateInput = {
      kind: 'completion',
      prompt,
      ...samplingOf(body, body.max_tokens ?? 16),
      adapter,
      signal,
    };
    const id = `cmpl-${randomBytes(12).toString('hex')}`;
    const head = { id, object: 'text_completion', created: now(), model: body.model };
    if (!stream) {
      const out = await generate(entry, input);
      return send(res, 200, {
        ...head,
        choices: [{ text: out.text, index: 0, logprobs: null, finish_reason: out.finishReason }],
        usage: usageOf(out),
      });
    }
    const sse = eventStream(res, includeUsage);
    const out = await sse.run(
      () => {},
      (onText) => generate(entry, { ...input, onText }),
      (text) => sse.chunk({ ...head, choices: [{ text, index: 0, logprobs: null, finish_reason: null }] }),
    );
    if (!out) return;
    sse.chunk({ ...head, choices: [{ text: '', index: 0, logprobs: null, finish_reason: out.finishReason }] });
    sse.end({ ...head, choices: [], usage: usageOf(out) });
  }

  async function embeddings(res: ServerResponse, open: Entry[], raw: unknown, signal: AbortSignal) {
    const body = parse(embeddingBody, raw);
    const { entry, adapter } = resolveModel(open, body.model);
    if (adapter || !entry.model.embeddings) {
      throw invalid(
        `The model \`${body.model}\` does not make embeddings; ask /v1/embeddings for an embedding model, or /v1/chat/completions for this one.`,
        'model',
        'unsupported_value',
      );
    }
    const input = typeof body.input === 'string' ? [body.input] : body.input;
    const out = await entry.model.embed(input, signal);
    const width = out.vectors[0]?.length ?? 0;
    if (body.dimensions != null && body.dimensions !== width) {
      throw invalid(
        `This model makes vectors of ${width} dimensions; leave 'dimensions' out or give ${width}.`,
        'dimensions',
      );
    }
    send(res, 200, {
      object: 'list',
      data: out.vectors.map((v, index) => ({
        object: 'embedding',
        index,
        embedding: body.encoding_format === 'base64' ? float32Base64(v) : v,
      })),
      model: body.model,
      usage: { prompt_tokens: out.promptTokens, total_tokens: out.promptTokens },
    });
  }

  async function generate(entry: Entry, input: GenerateInput): Promise<Generated> {
    try {
      return await entry.model.generate(input);
    } catch (err) {
      if (entry.gone && !(err instanceof EngineError) && !input.signal.aborted) {
        throw new ApiError(
          503,
          `The replica of ${entry.model.name} stopped while answering; try again (another replica may serve it).`,
          'server_error',
        );
      }
      throw err;
    }
  }

  return {
    serve(model, engineKey) {
      if (!engineKey) throw new Error(`an engine key is needed to serve ${model.name}`);
      served.set(model, { model, keyHash: hashSecret(engineKey), created: now(), gone: false });
    },
    unserve(name, model) {
      for (const [m, entry] of served)
        if (model ? m === model : m.name === name) {
          entry.gone = true;
          served.delete(m);
        }
    },
    listen(at) {
      return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(at.port, at.host, () => {
          server.off('error', reject);
          const { address, port } = server.address() as AddressInfo;
          // A wildcard address is not one to connect to: this machine reaches it at loopback.
          const host = address === '0.0.0.0' ? '127.0.0.1' : address === '::' ? '::1' : address;
          const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
          log.info('serving OpenAI-compatible requests', { url: `${url}/v1` });
          resolve(url);
        });
      });
    },
    async close() {
      if (!server.listening) return;
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const c of inFlight) c.abort(new Error('the agent is stopping'));
      server.closeAllConnections();
      await closed;
    },
  };
}
