import type { ChatHistoryItem, LlamaModel } from 'node-llama-cpp';
import { type ChatMessage, EngineError } from './engine.js';

// A request as node-llama-cpp reads it, for the llama.cpp replica (llama-model.ts): the chat history its chat
// template renders, and the token a completion's prompt starts with (so its prompt tokens are counted right).

/** A request's messages as node-llama-cpp's chat history: system turns, then user and model turns in order. */
export function chatHistory(messages: ChatMessage[]): ChatHistoryItem[] {
  if (messages.length === 0) throw new EngineError('bad_request', 'messages is empty: send at least one', 'messages');
  const last = messages.at(-1)!;
  if (last.role !== 'user')
    throw new EngineError(
      'bad_request',
      `the last message is the ${last.role}'s; this engine answers a user message, so end with one`,
      'messages',
    );
  return messages.map((m, i): ChatHistoryItem => {
    switch (m.role) {
      case 'system':
      case 'developer':
        return { type: 'system', text: m.content };
      case 'user':
        return { type: 'user', text: m.content };
      case 'assistant':
        return { type: 'model', response: [m.content] };
      default:
        throw new EngineError(
          'bad_request',
          `messages[${i}] is a ${m.role} message; this engine takes system, developer, user and assistant messages`,
          'messages',
        );
    }
  });
}

/** The token LlamaCompletion puts before a prompt (node-llama-cpp's resolveBeginningTokenToPrepend, not exported). */
export function beginningToken(model: LlamaModel) {
  const type = String(model.vocabularyType);
  if (type === 'rwkv' || type === 'ugm') return null;
  if (type === 'wpm') return model.tokens.bos;
  return model.tokens.shouldPrependBosToken ? model.tokens.bos : null;
}
