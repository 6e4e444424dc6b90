import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  lengthLine,
  moreThanShown,
  reportSummary,
  reportVerdict,
  type TrainDataReport,
  uploadTrainData,
} from './train-data';

afterEach(() => {
  // biome-ignore lint/suspicious/noDocumentCookie: the test sets the cookie the server would set.
  document.cookie = 'hangar_csrf=; max-age=0';
});

const sha = 'ab12cd34ef56'.padEnd(64, '0');

function report(over: Partial<TrainDataReport> = {}): TrainDataReport {
  return {
    pairs: 120,
    bytes: 49_357,
    sha256: sha,
    ok: true,
    errors: [],
    errorCount: 0,
    duplicates: [],
    duplicateCount: 0,
    collections: [],
    question: { min: 12, max: 200, mean: 41.5, p50: 40, p95: 80 },
    answer: { min: 3, max: 900, mean: 210.2, p50: 180, p95: 640 },
    ...over,
  };
}

describe('the report, in words', () => {
  it('sums it up in one line: pairs, size, the sha256 to compare by eye', () => {
    expect(reportSummary(report())).toBe('120 pairs · 48 KiB · sha256 ab12cd34ef56…');
    expect(reportSummary(report({ pairs: 1, bytes: 20 }))).toBe('1 pair · 20 B · sha256 ab12cd34ef56…');
    expect(reportSummary(report({ pairs: 12_345 }))).toMatch(/^12,345 pairs/);
  });

  it('says whether the pairs can be trained on, and what to do when not', () => {
    expect(reportVerdict(report())).toBe('Ready to train on.');
    expect(reportVerdict(report({ duplicateCount: 2 }))).toBe(
      'Ready to train on. 2 pairs repeat an earlier one: they count twice.',
    );
    expect(reportVerdict(report({ ok: false, errorCount: 1 }))).toBe(
      '1 line is not a pair: fix it and choose the file again.',
    );
    expect(reportVerdict(report({ ok: false, errorCount: 3 }))).toBe(
      '3 lines are not a pair: fix them and choose the file again.',
    );
    expect(reportVerdict(report({ ok: false, pairs: 0 }))).toMatch(/^The file holds no pairs/);
  });

  it('gives lengths from shortest to longest, and says how many bad lines are not shown', () => {
    expect(lengthLine(report().question)).toBe('min 12 · median 40 · mean 41.5 · p95 80 · max 200');
    expect(lengthLine(null)).toBe('—');
    expect(moreThanShown(20, 1234)).toBe('and 1,214 more');
    expect(moreThanShown(3, 3)).toBeNull();
  });
});

describe('uploadTrainData', () => {
  it('posts the file with the CSRF header and answers with the report', async () => {
    // biome-ignore lint/suspicious/noDocumentCookie: the test sets the cookie the server would set.
    document.cookie = 'hangar_csrf=token-1';
    const fetch = vi.fn(async () => Response.json(report()));
    const file = new Blob(['{"q":"hi","a":"hello"}\n']);
    const answer = await uploadTrainData(file, fetch);

    expect(answer).toEqual({ ok: true, report: report() });
    const [[url, init]] = fetch.mock.calls as unknown as [[string, RequestInit]];
    expect(url).toBe('/api/train/data');
    expect(init.method).toBe('POST');
    expect(init.body).toBe(file);
    expect(new Headers(init.headers).get('x-hangar-csrf')).toBe('token-1');
  });

  it('says why the server refused it, in its words', async () => {
    const fetch = vi.fn(async () =>
      Response.json({ error: 'uploading training data needs the OPERATOR role' }, { status: 403 }),
    );
    expect(await uploadTrainData(new Blob(['x']), fetch)).toEqual({
      ok: false,
      message: 'The pairs were not checked: uploading training data needs the OPERATOR role',
    });
    const down = vi.fn(async () => {
      throw new TypeError('Failed to fetch');
    });
    expect(await uploadTrainData(new Blob(['x']), down)).toEqual({
      ok: false,
      message: 'Could not reach the Hangar server: Failed to fetch',
    });
  });
});
