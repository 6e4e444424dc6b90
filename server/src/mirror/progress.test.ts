import { describe, expect, it } from 'vitest';
import { modelFamily } from './progress.js';

describe('modelFamily', () => {
  it('is the letters a name starts with, as people name model families', () => {
    expect(modelFamily('qwen2.5-coder-7b')).toBe('qwen');
    expect(modelFamily('Qwen3-8B')).toBe('qwen');
    expect(modelFamily('deepseek-r1-distill-qwen-14b')).toBe('deepseek');
    expect(modelFamily('tiny-llama')).toBe('tiny');
  });

  it('keeps the first part whole when it starts with one letter, a digit or a symbol', () => {
    expect(modelFamily('t5-small')).toBe('t5');
    expect(modelFamily('e2e-outage')).toBe('e2e');
    expect(modelFamily('01-ai-yi')).toBe('01');
  });
});
