import { describe, expect, it } from 'vitest';
import { formatBytes, formatCount, formatDuration, formatRate, shortSha } from './format';

describe('formatBytes', () => {
  it('counts in binary units, the same everywhere in the console', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1023)).toBe('1023 B');
    expect(formatBytes(1024)).toBe('1.0 KiB');
    expect(formatBytes(3 * 1024 * 1024)).toBe('3.0 MiB');
    expect(formatBytes(4.7 * 1024 ** 3)).toBe('4.7 GiB');
    expect(formatBytes(512_000_000_000)).toBe('477 GiB');
    expect(formatRate(50 * 1024 ** 2)).toBe('50 MiB/s');
  });
});

describe('formatDuration', () => {
  it('says how long, to the precision an operator plans with', () => {
    expect(formatDuration(40)).toBe('40 s');
    expect(formatDuration(185)).toBe('3 min');
    expect(formatDuration(3599)).toBe('59 min');
    expect(formatDuration(2 * 3600 + 5 * 60)).toBe('2 h 5 min');
    expect(formatDuration(3 * 86_400 + 4 * 3600 + 59)).toBe('3 d 4 h');
  });
});

it('shortens a sha256 to 12 hex digits', () => {
  expect(shortSha('a'.repeat(64))).toBe(`${'a'.repeat(12)}…`);
});

it('shortens a registry count, as the registry shows it', () => {
  expect(formatCount(950)).toBe('950');
  expect(formatCount(12_345)).toBe('12.3K');
  expect(formatCount(4_060_000)).toBe('4.1M');
});

describe('refusals as people read them', () => {
  it('names a GraphQL path by its label, not as the path a script sees', async () => {
    const { fieldLabel, readableRefusal, atFieldRefusal } = await import('./format');
    expect(fieldLabel('input.newPassword')).toBe('New password');
    expect(fieldLabel('sources.0.url')).toBe('Source 1 URL');
    expect(fieldLabel('input.gpuMiB')).toBe('GPU MiB');
    expect(fieldLabel('params.rank')).toBe('Params rank');
    expect(readableRefusal('input.password: at least 12 characters')).toBe('Password: at least 12 characters');
    expect(readableRefusal('sources.0.url: an absolute URL')).toBe('Source 1 URL: an absolute URL');
    // Prose with a colon is left alone: only a dotted path at the start is a field.
    expect(readableRefusal('not fetched: the header says clip')).toBe('not fetched: the header says clip');
    expect(atFieldRefusal('input.password: at least 12 characters')).toBe('at least 12 characters');
  });
});
