import type { IncomingHttpHeaders } from 'node:http';
import type { RoutingPolicy } from '../generated/prisma/enums.js';
import { hashText } from './ring.js';

// What keeps a conversation on the replica that already holds its prompt in its KV cache (llama.cpp's slots,
// vLLM's prefix cache): a key for the hash ring (ring.ts), worked out from the request without copying it.
//
// - A session key, when the caller gives one: OpenAI's `prompt_cache_key`, an `x-session-id` header, or OpenAI's
//   `user`. Every request of the session goes to one replica while it has room.
// - Otherwise, under PREFIX, the start of the prompt: the messages up to and including the first user message
//   (the system prompt and the question that opened the conversation, which every later turn repeats), or the first
//   PROMPT_BLOCKS blocks of a completion's prompt. Turn 20 of a conversation hashes like turn 1.
//
// Every key is hashed with the caller's owner scope and the adapter: a cached prefix answers faster, which another
// tenant could time, so two tenants sending the same prompt are routed by their own hashes and do not meet on a
// cache by design of the routing. (What remains: a replica's cache is per replica, not per tenant; two tenants
// whose hashes name the same replica share its cache memory, and only their own prefixes ever match.)

/** Characters per block: the granularity a prompt's start is hashed at. */
export const PREFIX_BLOCK_CHARS = 256;
/** A chat's opening is hashed up to this many blocks (16 KiB): a longer system prompt is told apart by its start. */
export const CHAT_PREFIX_BLOCKS = 64;
/** A completion's prompt (which grows as one string) is hashed over its first blocks only (1 KiB). */
export const PROMPT_BLOCKS = 4;

const SEP = '\u0000';
const SESSION_TAG = 's\u0000';
const PREFIX_TAG = 'p\u0000';

/** The caller's session key, if it sent one; in OpenAI's order of meaning (a cache key first, an end user last). */
export function sessionKeyOf(body: Record<string, unknown>, headers: IncomingHttpHeaders): string | undefined {
  if (typeof body.prompt_cache_key === 'string' && body.prompt_cache_key) return body.prompt_cache_key;
  const header = headers['x-session-id'];
  if (typeof header === 'string' && header) return header;
  if (typeof body.user === 'string' && body.user) return body.user;
  return undefined;
}

/**
 * The ring key for a request, or undefined when the policy routes it to the least loaded replica (LEAST_LOADED,
 * embeddings, SESSION without a session key, a body with no prompt to hash).
 */
export function affinityKey(o: {
  policy: RoutingPolicy;
  route: string;
  body: Record<string, unknown>;
  headers: IncomingHttpHeaders;
  /** Whose cache this may be: the caller's owner scope. */
  scope: string;
  adapter: string;
}): number | undefined {
  if (o.policy === 'LEAST_LOADED' || o.route === '/embeddings') return undefined;
  let h = hashText(o.scope);
  h = hashText(SEP, h);
  h = hashText(o.adapter, h);
  h = hashText(SEP, h);
  const session = sessionKeyOf(o.body, o.headers);
  if (session !== undefined) return hashText(session, hashText(SESSION_TAG, h));
  if (o.policy !== 'PREFIX') return undefined;
  h = hashText(PREFIX_TAG, h);
  if (o.route === '/completions') {
    const prompt = typeof o.body.prompt === 'string' ? o.body.prompt : undefined;
    return prompt ? hashText(prompt, h, PROMPT_BLOCKS * PREFIX_BLOCK_CHARS) : undefined;
  }
  const messages = o.body.messages;
  if (!Array.isArray(messages) || messages.length === 0) return undefined;
  let left = CHAT_PREFIX_BLOCKS * PREFIX_BLOCK_CHARS;
  for (const m of messages) {
    if (typeof m !== 'object' || m === null || left <= 0) break;
    const { role, content } = m as { role?: unknown; content?: unknown };
    if (typeof role === 'string') h = hashText(role, h);
    h = hashText(SEP, h);
    if (typeof content === 'string') {
      h = hashText(content, h, left);
      left -= content.length;
    } else if (Array.isArray(content)) {
      // OpenAI's content parts: the text ones are the prompt's words (an image's URL would hash a changing link).
      for (const part of content) {
        const text = (part as { text?: unknown } | null)?.text;
        if (typeof text !== 'string' || left <= 0) continue;
        h = hashText(text, h, left);
        left -= text.length;
      }
    }
    if (role === 'user') break;
  }
  return h;
}
