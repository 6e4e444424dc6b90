import { type ApiError, invalid } from '@hangar/common/openai-error';
import { z } from 'zod';

// What the OpenAI-compatible endpoint (http.ts) accepts in a request body, and how a refused field is named in
// OpenAI's error shape. Kept apart from the server so the protocol's rules read in one place.

// --- Request bodies -------------------------------------------------------------------------------------------
// Unknown fields are dropped, as OpenAI ignores them. Fields whose meaning this endpoint cannot honour (several
// choices, log probabilities, tools) are refused by name instead: answering without them would look like success.

const optional = <T extends z.ZodType>(s: T) => s.nullish();

const modelField = z
  .string({ error: 'a model name, as GET /v1/models lists them' })
  .min(1, 'a model name, as GET /v1/models lists them');
const temperature = optional(
  z.number({ error: 'a number from 0 to 2' }).min(0, 'a number from 0 to 2').max(2, 'a number from 0 to 2'),
);
const topP = optional(
  z.number({ error: 'a number from 0 to 1' }).min(0, 'a number from 0 to 1').max(1, 'a number from 0 to 1'),
);
const tokens = optional(
  z.int({ error: 'a whole number of tokens, 1 or more' }).min(1, 'a whole number of tokens, 1 or more'),
);
const seed = optional(z.int({ error: 'a whole number' }));
const stop = optional(
  z.union([z.string().min(1), z.array(z.string().min(1)).max(4, 'at most 4 stop sequences, as OpenAI allows')], {
    error: 'a non-empty string or an array of up to 4 non-empty strings',
  }),
);
const n = optional(
  z.int({ error: 'the number of choices: only 1' }).refine((v) => v === 1, {
    message: 'this endpoint makes one choice per request (n = 1): send separate requests for more choices',
  }),
);
const stream = optional(z.boolean({ error: 'true or false' }));
const streamOptions = optional(
  z.object(
    { include_usage: optional(z.boolean({ error: 'true or false' })) },
    { error: 'an object such as {"include_usage": true}' },
  ),
);
const notHonoured = (what: string) =>
  optional(z.unknown()).refine((v) => v === undefined || v === null || v === false || (Array.isArray(v) && !v.length), {
    message: `${what} is not offered by this endpoint: leave it out`,
  });

const sampling = {
  model: modelField,
  temperature,
  top_p: topP,
  seed,
  stop,
  n,
  stream,
  stream_options: streamOptions,
  logprobs: notHonoured('logprobs'),
};

const textPart = z.object({
  type: z.literal('text', { error: 'only text parts ({"type": "text", "text": "…"}): this model reads text only' }),
  text: z.string({ error: 'the text of the part, a string' }),
});
const messageContent = z.union([z.string(), z.array(textPart)], {
  error: 'a string or an array of {"type": "text", "text": "…"} parts',
});
const message = z.object({
  role: z.enum(['system', 'developer', 'user', 'assistant', 'tool'], {
    error: "one of 'system', 'developer', 'user', 'assistant', 'tool'",
  }),
  // An assistant turn may carry no content (OpenAI allows it beside tool calls): it is read as empty.
  content: messageContent.nullish(),
});

export const chatBody = z.object({
  ...sampling,
  messages: z.array(message, { error: 'an array of {"role", "content"} messages' }).min(1, 'at least one message'),
  max_tokens: tokens,
  max_completion_tokens: tokens,
  top_logprobs: notHonoured('top_logprobs'),
  tools: notHonoured('tools'),
  response_format: optional(z.unknown()).refine(
    (v) => v === undefined || v === null || (typeof v === 'object' && (v as { type?: unknown }).type === 'text'),
    { message: 'only {"type": "text"}: structured output is not offered by this endpoint' },
  ),
});

export const completionBody = z.object({
  ...sampling,
  prompt: z.union([z.string(), z.array(z.string()).length(1, 'one prompt per request')], {
    error: 'the prompt as a string (one per request; token arrays are not accepted)',
  }),
  max_tokens: tokens,
  echo: notHonoured('echo'),
  suffix: notHonoured('suffix'),
  best_of: optional(z.int().refine((v) => v === 1, { message: 'only 1 (one candidate per request)' })),
});

export const embeddingBody = z.object({
  model: modelField,
  input: z.union(
    [
      z.string().min(1, 'text, not empty'),
      z.array(z.string().min(1, 'text, not empty')).min(1, 'at least one text').max(2048, 'at most 2048 texts'),
    ],
    { error: 'a string or an array of up to 2048 non-empty strings (token arrays are not accepted)' },
  ),
  encoding_format: optional(z.enum(['float', 'base64'], { error: "'float' or 'base64'" })),
  dimensions: optional(z.int({ error: 'a whole number' }).min(1, 'a whole number, 1 or more')),
});

/** Zod's first issue as OpenAI names it: `param` is the field's path, e.g. messages[0].role. */
function refusal(error: z.ZodError, raw: unknown): ApiError {
  const issue = error.issues[0];
  const path = issue?.path ?? [];
  const param = path.reduce<string>(
    (p, k) => (typeof k === 'number' ? `${p}[${k}]` : p ? `${p}.${String(k)}` : String(k)),
    '',
  );
  let value: unknown = raw;
  for (const k of path) value = (value as Record<PropertyKey, unknown> | undefined)?.[k as PropertyKey];
  if (value === undefined && issue?.code === 'invalid_type') {
    return invalid(`Missing required parameter: '${param}'.`, param, 'missing_required_parameter');
  }
  const shown = JSON.stringify(value);
  const got = shown === undefined ? '' : ` (got ${shown.length > 60 ? `${shown.slice(0, 60)}…` : shown})`;
  return invalid(
    `Invalid '${param}'${got}: ${issue?.message ?? 'not accepted'}.`,
    param || null,
    issue?.code === 'invalid_type' ? 'invalid_type' : 'invalid_value',
  );
}

export function parse<S extends z.ZodType>(schema: S, raw: unknown): z.output<S> {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    throw invalid('The request body must be a JSON object.', null, null);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) throw refusal(parsed.error, raw);
  return parsed.data;
}

export function streamFields(body: { stream?: boolean | null; stream_options?: unknown }) {
  if (body.stream_options != null && !body.stream) {
    throw invalid(
      "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
      'stream_options',
      'invalid_value',
    );
  }
  const includeUsage = !!(body.stream_options as { include_usage?: boolean | null } | null | undefined)?.include_usage;
  return { stream: !!body.stream, includeUsage };
}

export function samplingOf(body: z.output<typeof chatBody> | z.output<typeof completionBody>, maxTokens?: number) {
  return {
    maxTokens,
    temperature: body.temperature ?? undefined,
    topP: body.top_p ?? undefined,
    seed: body.seed ?? undefined,
    stop: body.stop == null ? undefined : typeof body.stop === 'string' ? [body.stop] : body.stop,
  };
}
