import { fail, ok, type Result, ValidationError } from '../lib/errors.js';

// The trainer's settings, with what each may be. The ranges are wide enough for any sane run and narrow enough
// that a typo (lr 2 instead of 2e-4, rank 4096) is refused here, before a GPU spends an hour on it.

type Range = { min: number; max: number; whole: boolean; default: number; about: string };

export const TRAIN_PARAMS = {
  rank: { min: 1, max: 256, whole: true, default: 16, about: 'the LoRA rank r' },
  alpha: { min: 1, max: 1024, whole: false, default: 32, about: 'the LoRA alpha (scale = alpha / rank)' },
  dropout: { min: 0, max: 0.9, whole: false, default: 0.05, about: 'the LoRA dropout' },
  epochs: { min: 1, max: 100, whole: true, default: 3, about: 'passes over the pairs' },
  lr: { min: 1e-7, max: 1e-2, whole: false, default: 2e-4, about: 'the peak learning rate' },
  batch: { min: 1, max: 128, whole: true, default: 4, about: 'pairs per optimizer step' },
  max_len: { min: 16, max: 32768, whole: true, default: 1024, about: 'tokens per pair at most' },
  seed: { min: 0, max: 2 ** 31, whole: true, default: 42, about: 'the random seed' },
} as const satisfies Record<string, Range>;

export type TrainParamName = keyof typeof TRAIN_PARAMS;
export type TrainParams = Record<TrainParamName, number>;

const names = Object.keys(TRAIN_PARAMS) as TrainParamName[];

const describe = (k: TrainParamName) => {
  const r: Range = TRAIN_PARAMS[k];
  return `${k} ${r.whole ? 'a whole number' : 'a number'} from ${r.min} to ${r.max}`;
};

/** The accepted params, one per line of a refusal: "rank a whole number from 1 to 256; alpha …". */
export const PARAMS_ACCEPTED = names.map(describe).join('; ');

/**
 * Checks the params a caller gave and fills in the defaults. A refusal names the param (`params.rank`) and its
 * range, or lists every param the trainer takes when the name is unknown.
 */
export function parseParams(raw: unknown): Result<TrainParams, ValidationError> {
  const out = Object.fromEntries(names.map((k) => [k, TRAIN_PARAMS[k].default])) as TrainParams;
  if (raw == null) return ok(out);
  if (typeof raw !== 'object' || Array.isArray(raw))
    return fail(new ValidationError('params', `params is an object of numbers: ${PARAMS_ACCEPTED}`));
  for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
    if (!(k in TRAIN_PARAMS))
      return fail(
        new ValidationError(
          `params.${k}`,
          `params.${k} is not a trainer setting; the trainer takes ${PARAMS_ACCEPTED}`,
        ),
      );
    const name = k as TrainParamName;
    const r: Range = TRAIN_PARAMS[name];
    const bad =
      typeof v !== 'number' || !Number.isFinite(v) || v < r.min || v > r.max || (r.whole && !Number.isInteger(v));
    if (bad)
      return fail(
        new ValidationError(
          `params.${k}`,
          `params.${k} (${r.about}) is ${describe(name).slice(k.length + 1)}: ${JSON.stringify(v)} is not`,
        ),
      );
    out[name] = v as number;
  }
  return ok(out);
}
