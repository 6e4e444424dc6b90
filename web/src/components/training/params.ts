// The trainer's settings as the server lists them (trainParams), checked here with the same ranges before a job
// is sent, so a typo (lr 2 instead of 2e-4) is named at its field at once; the server checks them again.

export type TrainParam = {
  name: string;
  about: string;
  min: number;
  max: number;
  default: number;
  whole: boolean;
};

/** "a whole number from 1 to 256", "a number from 1e-7 to 0.01": what the server's refusal says too. */
export function paramRange(p: TrainParam): string {
  return `${p.whole ? 'a whole number' : 'a number'} from ${p.min} to ${p.max}`;
}

/** The step of the param's number input: 1 for whole numbers, otherwise any. */
export function paramStep(p: TrainParam): number | 'any' {
  return p.whole ? 1 : 'any';
}

/** Why a typed value is refused, naming the param and its range; undefined when it is accepted. */
export function paramError(p: TrainParam, raw: string): string | undefined {
  const text = raw.trim();
  const what = `${p.name} (${p.about}) is ${paramRange(p)}`;
  if (text === '') return `${what}: give one (the default is ${p.default})`;
  const value = Number(text);
  if (!Number.isFinite(value)) return `${what}: ${JSON.stringify(text)} is not a number`;
  if (value < p.min || value > p.max || (p.whole && !Number.isInteger(value))) return `${what}: ${text} is not`;
  return undefined;
}

export type ParamsCheck = { ok: true; params: Record<string, number> } | { ok: false; errors: Record<string, string> };

/** Every param's typed value checked; the numbers to send when all are accepted, else each refusal by name. */
export function checkParams(params: readonly TrainParam[], values: Readonly<Record<string, string>>): ParamsCheck {
  const errors: Record<string, string> = {};
  const out: Record<string, number> = {};
  for (const p of params) {
    const raw = values[p.name] ?? String(p.default);
    const error = paramError(p, raw);
    if (error) errors[p.name] = error;
    else out[p.name] = Number(raw.trim());
  }
  return Object.keys(errors).length ? { ok: false, errors } : { ok: true, params: out };
}

/** The form's starting values: each param's default, as text. */
export function defaultParamValues(params: readonly TrainParam[]): Record<string, string> {
  return Object.fromEntries(params.map((p) => [p.name, String(p.default)]));
}
