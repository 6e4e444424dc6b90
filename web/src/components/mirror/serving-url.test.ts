import { describe, expect, it } from 'vitest';
import { servingUrl } from './version-row';

// A mirror row offered the version's folder to copy; llama.cpp (and so a catalog entry of a GGUF model) needs the
// model's file, a split model its first shard.
const base = 'http://h:4000/mirror/qwen/v1';
const file = (name: string) => ({ file: name, url: `${base}/${name}` }) as never;

describe('the URL a mirror row offers to copy', () => {
  it("is a one-file GGUF model's file, not its folder", () => {
    expect(servingUrl({ url: `${base}/`, files: [file('qwen-Q4_K_M.gguf')] })).toBe(`${base}/qwen-Q4_K_M.gguf`);
  });

  it("is a split model's first shard, whatever order the files are listed in", () => {
    const files = [file('q-00002-of-00003.gguf'), file('q-00001-of-00003.gguf'), file('q-00003-of-00003.gguf')];
    expect(servingUrl({ url: `${base}/`, files })).toBe(`${base}/q-00001-of-00003.gguf`);
  });

  it('is the model beside its projector, and the folder for safetensors (vLLM reads the folder)', () => {
    expect(servingUrl({ url: `${base}/`, files: [file('mmproj-F16.gguf'), file('model-Q8_0.gguf')] })).toBe(
      `${base}/model-Q8_0.gguf`,
    );
    expect(servingUrl({ url: `${base}/`, files: [file('config.json'), file('model.safetensors')] })).toBe(`${base}/`);
  });
});
