import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  diskFree,
  llamaCppBuildOf,
  llamaCppEngine,
  onPath,
  parseNvidiaSmi,
  readGpus,
  vllmCommand,
  vllmEngine,
} from './inventory.js';

describe('nvidia-smi', () => {
  it('parses several GPUs, odd whitespace, CRLF, blank lines and a name with a comma', () => {
    const out = [
      '0, NVIDIA GeForce RTX 4090, 24564, 20000',
      '1,NVIDIA A100-SXM4-80GB,81920,   512  \r',
      '',
      '  2 ,  NVIDIA H100 80GB HBM3, rev 2 , 81559 , 81000',
      '   ',
    ].join('\n');
    expect(parseNvidiaSmi(out)).toEqual([
      { index: 0, name: 'NVIDIA GeForce RTX 4090', totalMiB: 24564, freeMiB: 20000 },
      { index: 1, name: 'NVIDIA A100-SXM4-80GB', totalMiB: 81920, freeMiB: 512 },
      { index: 2, name: 'NVIDIA H100 80GB HBM3, rev 2', totalMiB: 81559, freeMiB: 81000 },
    ]);
  });

  it('reads [N/A] sizes as 0 and refuses lines it cannot read', () => {
    expect(parseNvidiaSmi('0, NVIDIA GH200 480GB, [N/A], [N/A]\n')).toEqual([
      { index: 0, name: 'NVIDIA GH200 480GB', totalMiB: 0, freeMiB: 0 },
    ]);
    expect(() => parseNvidiaSmi('No devices were found')).toThrow(/does not understand: No devices were found/);
    expect(parseNvidiaSmi('')).toEqual([]);
  });

  it('falls back to the configured GPUs without nvidia-smi, and when it fails', async () => {
    const configured = [{ index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 }];
    const missing = Object.assign(new Error('spawn nvidia-smi ENOENT'), { code: 'ENOENT' });
    expect(await readGpus(configured, { exec: () => Promise.reject(missing) })).toEqual({
      gpus: configured,
      source: 'HANGAR_AGENT_GPUS',
    });
    const warnings: string[] = [];
    const broken = await readGpus(configured, {
      exec: () => Promise.reject(new Error('Failed to initialize NVML: Driver/library version mismatch')),
      warn: (m) => warnings.push(m),
    });
    expect(broken.source).toBe('HANGAR_AGENT_GPUS');
    expect(warnings).toHaveLength(1);
    const real = await readGpus(configured, { exec: async () => '0, NVIDIA L4, 23034, 22000\n' });
    expect(real).toEqual({
      gpus: [{ index: 0, name: 'NVIDIA L4', totalMiB: 23034, freeMiB: 22000 }],
      source: 'nvidia-smi',
    });
  });
});

describe('engines and disk', () => {
  it('turns llama.cpp release names into build numbers', () => {
    expect(llamaCppBuildOf('b4748')).toBe(4748);
    expect(llamaCppBuildOf('v0.5.0')).toBe(10460);
    expect(llamaCppBuildOf('v9.9.9')).toBeNull();
    expect(llamaCppEngine('v0.5.0')).toEqual({ name: 'llama.cpp', version: 'v0.5.0', build: 10460 });
    expect(llamaCppEngine('v9.9.9', 11000)).toEqual({ name: 'llama.cpp', version: 'v9.9.9', build: 11000 });
  });

  it('finds vLLM on PATH or as configured', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-path-'));
    const vllm = path.join(dir, 'vllm');
    await fs.writeFile(vllm, '#!/bin/sh\n', { mode: 0o755 });
    await fs.writeFile(path.join(dir, 'not-executable'), '', { mode: 0o644 });
    expect(await onPath('vllm', dir)).toBe(vllm);
    expect(await onPath('not-executable', dir)).toBeNull();
    expect(await onPath('vllm', '/nonexistent')).toBeNull();
    expect(await vllmCommand([vllm, '--port', '8001'], '')).toEqual([vllm, '--port', '8001']);
    expect(await vllmCommand([path.join(dir, 'missing')], dir)).toBeNull();
    expect(await vllmCommand(undefined, dir)).toEqual(['vllm', 'serve']);
    expect(await vllmEngine(undefined, '/nonexistent')).toBeNull();
    await fs.rm(dir, { recursive: true });
  });

  it('measures free disk space', async () => {
    expect(await diskFree(os.tmpdir())).toBeGreaterThan(0);
  });
});
