import { Field } from '../common/field';

// The New training job form's evaluation settings (#32): how much of the pairs is held out of training so that
// the adapter can be compared with its base on questions it never saw, and the seed that picks them. The server
// applies its own bounds too (at least 5 questions held out, at most 200, never more than half the pairs).

const MAX_SEED = 2_147_483_647;

export type EvalFieldsChecked =
  | { ok: true; evalShare: number; evalSeed: number | null }
  | { ok: false; errors: Record<string, string> };

/** The share typed in percent (0 to 50) as the API's fraction, and the seed when one is typed. */
export function checkEvalFields(share: string, seed: string): EvalFieldsChecked {
  const errors: Record<string, string> = {};
  const percent = Number(share.trim());
  if (share.trim() === '' || !Number.isFinite(percent) || percent < 0 || percent > 50)
    errors.evalShare = `the share of the pairs held out for evaluation, 0 to 50 %: ${share.trim() ? JSON.stringify(share.trim()) : 'nothing'} is not (0 holds none out, and the adapter is not evaluated)`;
  const n = Number(seed.trim());
  if (seed.trim() !== '' && (!Number.isInteger(n) || n < 0 || n > MAX_SEED))
    errors.evalSeed = `a whole number from 0 to ${MAX_SEED}, or nothing for the training seed: ${JSON.stringify(seed.trim())} is not`;
  if (Object.keys(errors).length) return { ok: false, errors };
  // Rounded so that 10 % is sent as 0.1, not 0.09999999999999999.
  return { ok: true, evalShare: Math.round(percent * 100) / 10_000, evalSeed: seed.trim() === '' ? null : n };
}

export function EvalFields({
  share,
  seed,
  onShare,
  onSeed,
  errorAt,
  pairs,
}: {
  share: string;
  seed: string;
  onShare: (v: string) => void;
  onSeed: (v: string) => void;
  errorAt: (field: string) => string | undefined;
  /** The chosen file's pair count, once checked: the hint says what the share comes to. */
  pairs: number | null;
}) {
  const percent = Number(share);
  const heldOut =
    pairs !== null && Number.isFinite(percent) && percent > 0 && percent <= 50 && pairs >= 2
      ? Math.min(Math.max(Math.ceil((pairs * percent) / 100), 5), 200, Math.floor(pairs / 2))
      : null;
  return (
    <div className="form-row">
      <Field
        label="Held out for evaluation (%)"
        type="number"
        min={0}
        max={50}
        step="any"
        value={share}
        onChange={(e) => onShare(e.target.value)}
        error={errorAt('evalShare')}
        hint={
          heldOut !== null
            ? `About ${heldOut} of the ${pairs} pairs are never trained on; base and adapter answer them after training.`
            : 'Pairs set aside, never trained on, to compare the adapter with its base: 0 to 50 %, at least 5 pairs; 0: none.'
        }
      />
      <Field
        label="Evaluation seed"
        type="number"
        min={0}
        max={MAX_SEED}
        step={1}
        value={seed}
        onChange={(e) => onSeed(e.target.value)}
        error={errorAt('evalSeed')}
        placeholder="the training seed"
        hint="Picks the held-out pairs; the same seed holds out the same pairs again."
      />
    </div>
  );
}
