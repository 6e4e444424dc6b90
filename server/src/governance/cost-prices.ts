import fs from 'node:fs/promises';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import { ConfigError } from '../config.js';
import type { Db, Tx } from '../db/client.js';
import type { Price } from '../generated/prisma/client.js';
import type { PriceTarget } from '../generated/prisma/enums.js';
import { ConflictError, fail, ok, type Result, ValidationError } from '../lib/errors.js';
import { notify } from '../pubsub.js';

// The prices an operator sets: per GPU-hour for a node or for a GPU model, per million tokens for a model. Set
// through GraphQL (ADMIN, audited in the transaction) or declared in hangar.yaml's `prices:` section, which the API
// then refuses to change (a change made there would silently revert at the next start, as for declared models).
// Every change sends the `pricing` event, so every server process reads its prices again (pricing.ts).

/** Money as people write it: up to 12 digits before the point and 6 after; no float ever holds it. */
const MONEY = /^\d{1,12}(\.\d{1,6})?$/;

/**
 * A price as typed ("2.50") or as YAML reads it (2.5), checked and kept as the decimal string stored; null
 * removes it. A float from YAML is written back with at most 6 decimals, which is what the table keeps.
 */
export function money(field: string, value: string | number | null | undefined): Result<string | null> {
  if (value == null) return ok(null);
  const text = typeof value === 'number' ? (Number.isFinite(value) ? String(value) : '') : value.trim();
  if (!MONEY.test(text)) {
    return fail(
      new ValidationError(
        field,
        `${field}: a price is a non-negative decimal with at most 6 places after the point ("2.50", "0.0004"); "${value}" is not`,
      ),
    );
  }
  return ok(text);
}

export type PriceInput = {
  target: PriceTarget;
  name: string;
  perGpuHour?: string | null;
  perMillionPromptTokens?: string | null;
  perMillionCompletionTokens?: string | null;
};

const WHAT: Record<PriceTarget, string> = { NODE: 'node', GPU: 'GPU model', MODEL: 'model' };

/** The audit target: "node gpu-1", "GPU model NVIDIA H100 80GB HBM3", "model llama". */
export const priceTarget = (p: { target: PriceTarget; name: string }) => `${WHAT[p.target]} ${p.name}`;

/** Checks a price's fields; all of them null means "remove it". */
export function checkPrice(input: PriceInput): Result<PriceInput> {
  const name = input.name.trim();
  if (!name || name.length > 200 || name.includes('\u0000')) {
    return fail(
      new ValidationError(
        'name',
        `name: the ${WHAT[input.target]}'s name as Hangar shows it, 1 to 200 characters; "${input.name}" is not`,
      ),
    );
  }
  const out: PriceInput = { target: input.target, name };
  for (const field of ['perGpuHour', 'perMillionPromptTokens', 'perMillionCompletionTokens'] as const) {
    const m = money(field, input[field]);
    if (!m.ok) return m;
    out[field] = m.value;
  }
  return ok(out);
}

/**
 * Writes (or, with every price null, removes) one price, audited in its transaction. A declared price is refused:
 * it is changed in hangar.yaml. Answers the row, or null once removed.
 */
export async function writePrice(
  deps: { db: Db; audit: AuditService },
  actor: Actor,
  input: PriceInput,
  action: string,
): Promise<Result<Price | null>> {
  const checked = checkPrice(input);
  if (!checked.ok) return checked;
  const p = checked.value;
  return deps.db.$transaction(async (tx) => {
    const where = { target_name: { target: p.target, name: p.name } };
    const existing = await tx.price.findUnique({ where });
    if (existing?.declared) {
      return fail(
        new ConflictError(
          `the price of ${priceTarget(p)} is declared in hangar.yaml (prices): change it there; it is read at every start`,
        ),
      );
    }
    const data = {
      perGpuHour: p.perGpuHour ?? null,
      perMillionPromptTokens: p.perMillionPromptTokens ?? null,
      perMillionCompletionTokens: p.perMillionCompletionTokens ?? null,
    };
    const removing = Object.values(data).every((v) => v === null);
    let row: Price | null = null;
    if (removing) {
      if (existing) await tx.price.delete({ where });
    } else {
      row = await tx.price.upsert({ where, create: { target: p.target, name: p.name, ...data }, update: data });
    }
    const said = Object.entries(data)
      .filter(([, v]) => v !== null)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
    await deps.audit.done(tx, actor, {
      action,
      target: priceTarget(p),
      message: removing ? 'price removed' : said,
    });
    await notify(tx, 'pricing', priceTarget(p));
    return ok(row);
  });
}

const amount = z.union([z.number().nonnegative('not below 0'), z.string()]);

// hangar.yaml's `prices:` section, one entry per thing priced:
//   prices:
//     - node: gpu-1
//       perGpuHour: 2.40
//     - gpu: NVIDIA H100 80GB HBM3
//       perGpuHour: 2.10
//     - model: llama-3.1-8b
//       perMillionPromptTokens: 0.05
//       perMillionCompletionTokens: 0.20
const declaredPrices = z.object({
  prices: z
    .array(
      z
        .object({
          node: z.string().min(1).optional(),
          gpu: z.string().min(1).optional(),
          model: z.string().min(1).optional(),
          perGpuHour: amount.optional(),
          perMillionPromptTokens: amount.optional(),
          perMillionCompletionTokens: amount.optional(),
        })
        .strict(),
    )
    .default([]),
});

/**
 * Reads hangar.yaml's prices and makes the declared rows match them exactly (prices declared before and gone from
 * the file are removed). A bad entry stops the start with a message naming its line in the list and its field.
 */
export async function loadDeclaredPrices(db: Db, file: string | undefined): Promise<number> {
  let entries: PriceInput[] = [];
  if (file) {
    const { parse: parseYaml } = await import('yaml');
    let raw: unknown;
    try {
      raw = parseYaml(await fs.readFile(file, 'utf8'));
    } catch (err) {
      throw new ConfigError(`HANGAR_CONFIG=${file} could not be read as YAML: ${(err as Error).message}`);
    }
    const parsed = declaredPrices.safeParse(raw ?? {});
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw new ConfigError(`HANGAR_CONFIG=${file}: ${issue?.path.join('.') || 'prices'}: ${issue?.message}`);
    }
    entries = parsed.data.prices.map((e, i) => {
      const named = [
        e.node !== undefined && { target: 'NODE' as const, name: e.node },
        e.gpu !== undefined && { target: 'GPU' as const, name: e.gpu },
        e.model !== undefined && { target: 'MODEL' as const, name: e.model },
      ].filter((x) => x !== false);
      const at = `HANGAR_CONFIG=${file}: prices.${i}`;
      if (named.length !== 1 || !named[0]) {
        throw new ConfigError(`${at}: name exactly one of node, gpu or model that the price is for`);
      }
      const isModel = named[0].target === 'MODEL';
      if (
        isModel
          ? e.perGpuHour !== undefined
          : e.perMillionPromptTokens !== undefined || e.perMillionCompletionTokens !== undefined
      ) {
        throw new ConfigError(
          `${at}: a node or a GPU model is priced with perGpuHour, a model with perMillionPromptTokens and perMillionCompletionTokens`,
        );
      }
      const checked = checkPrice({
        ...named[0],
        perGpuHour: e.perGpuHour as string | null | undefined,
        perMillionPromptTokens: e.perMillionPromptTokens as string | null | undefined,
        perMillionCompletionTokens: e.perMillionCompletionTokens as string | null | undefined,
      });
      if (!checked.ok) throw new ConfigError(`${at}.${checked.error.message}`);
      return checked.value;
    });
  }
  await db.$transaction(async (tx: Tx) => {
    const keep = new Set(entries.map((e) => `${e.target} ${e.name}`));
    const declared = await tx.price.findMany({ where: { declared: true } });
    for (const d of declared) if (!keep.has(`${d.target} ${d.name}`)) await tx.price.delete({ where: { id: d.id } });
    for (const e of entries) {
      const data = {
        perGpuHour: e.perGpuHour ?? null,
        perMillionPromptTokens: e.perMillionPromptTokens ?? null,
        perMillionCompletionTokens: e.perMillionCompletionTokens ?? null,
        declared: true,
      };
      await tx.price.upsert({
        where: { target_name: { target: e.target, name: e.name } },
        create: { target: e.target, name: e.name, ...data },
        update: data,
      });
    }
    await notify(tx, 'pricing', 'hangar.yaml');
  });
  return entries.length;
}
