import { describe, expect, it } from 'vitest';
import { EngineError } from './engine.js';
import { engineRefusal } from './reply.js';

// A prompt with no room left in the context is answered as OpenAI answers it: 400 `context_length_exceeded`, the
// code clients such as `hangar chat` read to drop their oldest turns (a plain invalid value would end the chat).
describe("the node's refusals in OpenAI's words", () => {
  it('answers a prompt that leaves no room in the context with context_length_exceeded', () => {
    const err = engineRefusal(new EngineError('too_long', 'the prompt is 300 tokens and tiny holds 256', 'messages'));
    expect(err?.status).toBe(400);
    expect(err?.body()).toEqual({
      error: {
        message: 'the prompt is 300 tokens and tiny holds 256',
        type: 'invalid_request_error',
        param: 'messages',
        code: 'context_length_exceeded',
      },
    });
  });
});
