import { describe, expect, it } from 'vitest';
import { ownerChoices } from './new-train-job';
import { checkParams, defaultParamValues, paramError, paramRange, paramStep, type TrainParam } from './params';

// As the server's trainParams lists them (server/src/train/params.ts).
const rank: TrainParam = { name: 'rank', about: 'the LoRA rank r', min: 1, max: 256, default: 16, whole: true };
const lr: TrainParam = {
  name: 'lr',
  about: 'the peak learning rate',
  min: 1e-7,
  max: 1e-2,
  default: 2e-4,
  whole: false,
};

describe('paramError', () => {
  it('accepts what the server accepts, in any way a number is written', () => {
    expect(paramError(rank, '16')).toBeUndefined();
    expect(paramError(rank, ' 256 ')).toBeUndefined();
    expect(paramError(lr, '2e-4')).toBeUndefined();
    expect(paramError(lr, '0.01')).toBeUndefined();
  });

  it('names the param, what it is and its range, and the value refused', () => {
    expect(paramError(rank, '300')).toBe('rank (the LoRA rank r) is a whole number from 1 to 256: 300 is not');
    expect(paramError(rank, '2.5')).toBe('rank (the LoRA rank r) is a whole number from 1 to 256: 2.5 is not');
    expect(paramError(lr, '2')).toBe('lr (the peak learning rate) is a number from 1e-7 to 0.01: 2 is not');
    expect(paramError(lr, 'fast')).toBe(
      'lr (the peak learning rate) is a number from 1e-7 to 0.01: "fast" is not a number',
    );
    expect(paramError(rank, '')).toBe(
      'rank (the LoRA rank r) is a whole number from 1 to 256: give one (the default is 16)',
    );
  });

  it('steps whole numbers by one', () => {
    expect(paramStep(rank)).toBe(1);
    expect(paramStep(lr)).toBe('any');
    expect(paramRange(rank)).toBe('a whole number from 1 to 256');
  });
});

describe('checkParams', () => {
  it('starts from the defaults and sends numbers', () => {
    const values = defaultParamValues([rank, lr]);
    expect(values).toEqual({ rank: '16', lr: '0.0002' });
    expect(checkParams([rank, lr], { ...values, rank: '32' })).toEqual({ ok: true, params: { rank: 32, lr: 0.0002 } });
  });

  it('refuses every bad value at once, by name', () => {
    const checked = checkParams([rank, lr], { rank: '0', lr: '1' });
    expect(checked.ok).toBe(false);
    if (!checked.ok) expect(Object.keys(checked.errors)).toEqual(['rank', 'lr']);
  });
});

describe('ownerChoices', () => {
  it('lists every org, team and project by path, and the caller, in the forms the server accepts', () => {
    expect(
      ownerChoices({
        viewer: { user: { email: 'ana@example.com' } },
        orgs: [
          {
            id: 'o',
            name: 'acme',
            teams: [{ id: 't', path: 'acme/research', projects: [{ id: 'p', path: 'acme/research/bots' }] }],
          },
        ],
      }),
    ).toEqual(['org:acme', 'team:acme/research', 'project:acme/research/bots', 'user:ana@example.com']);
    expect(ownerChoices(undefined)).toEqual([]);
  });
});
