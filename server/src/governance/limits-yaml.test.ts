import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { readDeclaredLimits } from './limits-yaml.js';

// hangar.yaml's `limits:` section as the server reads it at start: entries with their lines, and a bad entry
// refused naming the file, the line and the field.

async function file(text: string): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-limits-yaml-'));
  const p = path.join(dir, 'hangar.yaml');
  await fs.writeFile(p, text);
  return p;
}

describe('hangar.yaml limits', () => {
  it('reads each entry with its line, beside the models', async () => {
    const p = await file(
      [
        'models: []',
        'limits:',
        '  - scope: team:acme/research',
        '    requestsPerMinute: 600',
        '    tokensPerDay: 2000000',
        '  - scope: org:acme',
        '    model: tiny',
        '    spendPerMonth: 150.5',
        '',
      ].join('\n'),
    );
    expect(await readDeclaredLimits(p)).toEqual([
      {
        scope: 'team:acme/research',
        model: undefined,
        limit: { requestsPerMinute: 600, tokensPerDay: 2000000 },
        line: 3,
      },
      { scope: 'org:acme', model: 'tiny', limit: { spendPerMonth: 150.5 }, line: 6 },
    ]);
    expect(await readDeclaredLimits(await file('models: []\n'))).toEqual([]);
  });

  it('refuses a bad entry naming the line and the field', async () => {
    const bad = await file(
      [
        'limits:',
        '  - scope: team:acme/research',
        '    requestsPerMinute: 10',
        '  - scope: org:acme',
        '    tokensPerDay: -5',
        '',
      ].join('\n'),
    );
    await expect(readDeclaredLimits(bad)).rejects.toThrow(/line 5 \(tokensPerDay\): tokens per day is at least 0/);
    const unknown = await file(['limits:', '  - scope: org:acme', '    requestsPerHour: 5', ''].join('\n'));
    await expect(readDeclaredLimits(unknown)).rejects.toThrow(/line 3: requestsPerHour is not a limit/);
    const notList = await file(['limits:', '  scope: org:acme', ''].join('\n'));
    await expect(readDeclaredLimits(notList)).rejects.toThrow(/line 2: limits is a list/);
  });
});
