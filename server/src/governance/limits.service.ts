import { coalesced } from '@hangar/common/coalesce';
import type { Logger } from '@hangar/common/log';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import { systemActor } from '../auth/actor.js';
import { roleAtLeast } from '../auth/viewer.js';
import type { Db, Tx } from '../db/client.js';
import type { Limit } from '../generated/prisma/client.js';
import { ForbiddenError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import type { OrgService } from '../org/org.service.js';
import { sees } from '../org/org.service.js';
import { notify, onLocalNotify, type PubSub } from '../pubsub.js';
import { limitInput } from './limit-input.js';
import type { LimitEnforcer, LimitRule } from './limits-enforcer.js';
import type { LimitGate } from './limits-gate.js';
import type { RefusalTally } from './limits-refusers.js';
import { LIMIT_KINDS, type LimitKind, MONEY_SCALE } from './limits-windows.js';
import { readDeclaredLimits } from './limits-yaml.js';

// Limits as admins set them (setLimit, removeLimit, hangar.yaml's `limits:`) and as everyone reads them. The rules
// live in the Limit table; every server process keeps them in memory (LimitEnforcer.setRules) and reads them again
// on the `limits` event, which PostgreSQL delivers to every process when the change commits: a limit set takes
// effect on the next request everywhere. Refusals reach the audit log as one row per limit, kind and minute,
// counting them, not a row per request (a flood of refused requests would otherwise flood the log).

export { limitInput };

export const setLimitInput = z.object({
  scope: z
    .string()
    .trim()
    .min(1, 'a scope is key:<token id>, user:<email>, team:<org>/<team>, project:<org>/<team>/<project> or org:<org>'),
  model: z.string().trim().max(200, 'a model name is at most 200 characters').nullish(),
  limit: limitInput,
});

export type LimitUsage = { kind: LimitKind; limit: number; used: number; remaining: number; resetAt: Date };

export type LimitView = Limit & {
  scopeLabel: string;
  usage: LimitUsage[];
  /** Requests refused by this limit since this server started (this process). */
  refused: number;
};

export type LimitsServiceDeps = {
  db: Db;
  audit: AuditService;
  org: Pick<OrgService, 'resolveOwner' | 'formatOwners' | 'sightOf'>;
  log: Logger;
  enforcer: LimitEnforcer;
  /** Whether a model or adapter of that name exists (catalog's served names). */
  nameExists: (name: string) => Promise<boolean>;
  /** What the gateway calls on each request (limits-gate.ts). */
  gate: LimitGate;
  /** Who each limit refused, per caller, in the last minute window (limits-refusers.ts). */
  refusers?: RefusalTally;
};

export class LimitsService {
  private readonly deps: LimitsServiceDeps;
  private unhook: (() => void) | undefined;
  private readonly refusedThisMinute = new Map<
    string,
    { rule: LimitRule; kind: LimitKind; n: number; minute: number }
  >();
  private refusalTimer: NodeJS.Timeout | undefined;

  constructor(deps: LimitsServiceDeps) {
    this.deps = deps;
  }

  get enforcer(): LimitEnforcer {
    return this.deps.enforcer;
  }

  get gate(): LimitGate {
    return this.deps.gate;
  }

  /** Reads the rules, then again on every `limits` event (this process's own at once, before it commits back). */
  async start(pubsub: PubSub): Promise<void> {
    await this.reload();
    this.deps.enforcer.start();
    void (async () => {
      for await (const _ of pubsub.subscribe('limits')) void this.reload();
    })().catch(() => {});
    this.unhook = onLocalNotify((topic) => {
      // Queued, not committed yet: read again shortly after, and once more when the event comes back.
      if (topic === 'limits') setTimeout(() => void this.reload(), 0);
    });
    this.refusalTimer = setInterval(() => void this.auditRefusals(), 5000);
    this.refusalTimer.unref();
  }

  async stop(): Promise<void> {
    this.unhook?.();
    if (this.refusalTimer) clearInterval(this.refusalTimer);
    await this.auditRefusals();
    await this.deps.enforcer.stop();
  }

  /** Reads every limit into the enforcer; a failed read keeps the last rules (the database away: they still hold). */
  readonly reload = coalesced(async () => {
    try {
      const rows = await this.deps.db.loops.limit.findMany();
      this.deps.enforcer.setRules(await this.rulesOf(rows));
    } catch (err) {
      this.deps.log.warn('limits not read; the last ones stay in force', { error: String(err) });
      return false;
    }
  });

  /**
   * The callers this limit refused most over the last minute window (this process's count), each named as a scope
   * is ("key:nightly (ana@example.com)", "user:ana@example.com"): who is being refused, not only how often.
   */
  async refusedBy(
    limitId: string,
    top: number,
  ): Promise<{ caller: string; count: number; kinds: LimitKind[]; since: Date }[]> {
    const found = this.deps.refusers?.top(limitId, Math.min(Math.max(top, 0), 100)) ?? [];
    if (!found.length) return [];
    const owners = found
      .filter((r) => r.tokenId || r.userId)
      .map((r) => (r.tokenId ? { scope: 'key' as const, id: r.tokenId } : { scope: 'user' as const, id: r.userId }));
    const labels = await this.deps.org.formatOwners(owners);
    return found.map((r) => {
      const key = r.tokenId ? `key:${r.tokenId}` : r.userId ? `user:${r.userId}` : '';
      return {
        caller: key ? (labels.get(key) ?? key) : 'other callers (more than 1000 in a minute)',
        count: r.count,
        kinds: r.kinds,
        since: r.since,
      };
    });
  }

  /** Counted by the enforcer as refused; written to the audit log every few seconds, one row per limit and minute. */
  noteRefusal = (rule: LimitRule, kind: LimitKind) => {
    const minute = Math.floor(Date.now() / 60_000);
    const key = `${rule.id}|${kind}|${minute}`;
    const seen = this.refusedThisMinute.get(key);
    if (seen) seen.n++;
    else this.refusedThisMinute.set(key, { rule, kind, n: 1, minute });
  };

  private async auditRefusals() {
    const pending = [...this.refusedThisMinute.entries()];
    this.refusedThisMinute.clear();
    for (const [key, { rule, kind, n, minute }] of pending) {
      const at = new Date(minute * 60_000).toISOString().slice(0, 16);
      await this.deps.audit.refusedRepeated(
        systemActor('limits'),
        {
          action: 'limitRefused',
          target: `${rule.label}${rule.model ? ` ${rule.model}` : ''}`,
          message: `{n} requests refused by ${kind} in the minute from ${at}Z`,
        },
        `limit:${key}`,
        n,
      );
    }
  }

  private async rulesOf(rows: Limit[]): Promise<LimitRule[]> {
    const owners = rows.map((r) => r.scope);
    const labels = owners.length
      ? await this.deps.org.formatOwners(
          owners.map((o) => {
            const [scope, id] = o.split(':') as [never, string];
            return { scope, id };
          }),
        )
      : new Map<string, string>();
    return rows.map((r) => ({
      id: r.id,
      scope: r.scope,
      label: labels.get(r.scope) ?? r.scope,
      model: r.model,
      values: valuesOf(r),
    }));
  }

  // ─── changes (admins) ──────────────────────────────────────────────────────────────────────────────────────

  async setLimit(
    actor: Actor,
    input: z.input<typeof setLimitInput>,
    o: { declared?: boolean; db?: Tx } = {},
  ): Promise<Result<LimitView>> {
    const admin = this.adminOnly(actor, 'set a limit');
    if (admin) return fail(admin);
    const parsed = parseInput(setLimitInput, input, '');
    if (!parsed.ok) return parsed;
    const { limit } = parsed.value;
    const model = parsed.value.model ?? '';
    if (LIMIT_KINDS.every((k) => limit[k] === undefined || limit[k] === null)) {
      return fail(
        new ValidationError(
          'limit',
          `limit: set at least one of ${LIMIT_KINDS.join(', ')}; to remove a limit use removeLimit`,
        ),
      );
    }
    const owner = await this.deps.org.resolveOwner(parsed.value.scope, { field: 'scope' });
    if (!owner.ok) return owner;
    if (model && !(await this.deps.nameExists(model))) {
      return fail(
        new ValidationError(
          'model',
          `model: no model or adapter is named ${model}; leave it empty to limit every model`,
        ),
      );
    }
    const scope = `${owner.value.scope}:${owner.value.id}`;
    const data = {
      requestsPerMinute: limit.requestsPerMinute ?? null,
      tokensPerMinute: limit.tokensPerMinute ?? null,
      concurrentRequests: limit.concurrentRequests ?? null,
      tokensPerDay: limit.tokensPerDay === undefined || limit.tokensPerDay === null ? null : BigInt(limit.tokensPerDay),
      tokensPerMonth:
        limit.tokensPerMonth === undefined || limit.tokensPerMonth === null ? null : BigInt(limit.tokensPerMonth),
      spendPerMonth: limit.spendPerMonth ?? null,
      declared: o.declared ?? false,
    };
    const write = async (tx: Tx) => {
      const existing = await tx.limit.findUnique({ where: { scope_model: { scope, model } } });
      if (existing?.declared && !o.declared) {
        return fail(
          new ValidationError(
            'scope',
            `scope: the limit on ${owner.value.label}${model ? ` for ${model}` : ''} is declared in hangar.yaml; change it there`,
          ),
        );
      }
      const row = await tx.limit.upsert({
        where: { scope_model: { scope, model } },
        create: { scope, model, ...data },
        update: data,
      });
      await this.deps.audit.done(tx, actor, {
        action: 'setLimit',
        target: `${owner.value.label}${model ? ` ${model}` : ''}`,
        message: describeValues(valuesOf(row)),
      });
      await notify(tx, 'limits', scope);
      return ok(row);
    };
    const written = o.db ? await write(o.db) : await this.deps.db.$transaction(write);
    if (!written.ok) return written;
    await this.reload();
    return ok(this.view(written.value, owner.value.label));
  }

  async removeLimit(actor: Actor, input: { scope: string; model?: string | null }): Promise<Result<LimitView>> {
    const admin = this.adminOnly(actor, 'remove a limit');
    if (admin) return fail(admin);
    const owner = await this.deps.org.resolveOwner(input.scope, { field: 'scope' });
    if (!owner.ok) return owner;
    const scope = `${owner.value.scope}:${owner.value.id}`;
    const model = input.model?.trim() ?? '';
    const removed = await this.deps.db.$transaction(async (tx) => {
      const row = await tx.limit.findUnique({ where: { scope_model: { scope, model } } });
      if (!row) {
        return fail(
          new NotFoundError(
            `${owner.value.label} has no limit${model ? ` for ${model}` : ' on every model'}; limits(scope) lists what it has`,
          ),
        );
      }
      if (row.declared) {
        return fail(
          new ValidationError(
            'scope',
            `scope: the limit on ${owner.value.label} is declared in hangar.yaml; remove it there`,
          ),
        );
      }
      await tx.limit.delete({ where: { id: row.id } });
      await tx.limitWindow.deleteMany({ where: { limitId: row.id } });
      await this.deps.audit.done(tx, actor, {
        action: 'removeLimit',
        target: `${owner.value.label}${model ? ` ${model}` : ''}`,
      });
      await notify(tx, 'limits', scope);
      return ok(row);
    });
    if (!removed.ok) return removed;
    await this.reload();
    return ok(this.view(removed.value, owner.value.label));
  }

  /**
   * hangar.yaml's `limits:` (catalog-input.ts reads the file): each entry set as declared, and declared limits the
   * file no longer lists removed, all in one transaction, so a start never runs with half of them.
   */
  async loadDeclared(file: string | undefined): Promise<void> {
    const entries = await readDeclaredLimits(file);
    const actor = systemActor('hangar.yaml');
    const kept = new Set<string>();
    for (const e of entries) {
      const set = await this.setLimit(actor, { scope: e.scope, model: e.model, limit: e.limit }, { declared: true });
      if (!set.ok) throw new Error(`HANGAR_CONFIG=${file}, line ${e.line}: ${set.error.message}`);
      kept.add(set.value.id);
    }
    const stale = await this.deps.db.limit.findMany({ where: { declared: true, id: { notIn: [...kept] } } });
    for (const row of stale) {
      await this.deps.db.$transaction(async (tx) => {
        await tx.limit.delete({ where: { id: row.id } });
        await tx.limitWindow.deleteMany({ where: { limitId: row.id } });
        await this.deps.audit.done(tx, actor, {
          action: 'removeLimit',
          target: row.scope,
          message: 'no longer in hangar.yaml',
        });
        await notify(tx, 'limits', row.scope);
      });
    }
    if (stale.length) await this.reload();
  }

  // ─── reads ─────────────────────────────────────────────────────────────────────────────────────────────────

  /**
   * Limits an actor may read: an admin every one; anyone else those on scopes their sight admits (their teams,
   * projects and orgs, themselves, the token they call with). `scope`: one scope's only, as the operator types it.
   */
  async limits(actor: Actor, scope?: string | null): Promise<Result<LimitView[]>> {
    let where: { scope?: string } = {};
    let scopeLabel: string | undefined;
    if (scope?.trim()) {
      const owner = await this.deps.org.resolveOwner(scope, { field: 'scope' });
      if (!owner.ok) return owner;
      where = { scope: `${owner.value.scope}:${owner.value.id}` };
      scopeLabel = owner.value.label;
    }
    const sight = await this.deps.org.sightOf(actor.viewer);
    const v = actor.viewer;
    const own = v.kind === 'user' || v.kind === 'token' ? `user:${v.user.id}` : undefined;
    const ownKey = v.kind === 'token' ? `key:${v.tokenId}` : undefined;
    const rows = (await this.deps.db.limit.findMany({ where, orderBy: [{ scope: 'asc' }, { model: 'asc' }] })).filter(
      (r) => sight.admin || sees(sight, r.scope) || r.scope === own || r.scope === ownKey,
    );
    const labels = new Map(this.deps.enforcer.rules().map((r) => [r.scope, r.label]));
    return ok(rows.map((r) => this.view(r, scopeLabel ?? labels.get(r.scope) ?? r.scope)));
  }

  /** The limits on one token (key:<id>), for the Tokens page: its owner and admins may read them. */
  async tokenLimits(actor: Actor, token: { id: string; userId: string }): Promise<LimitView[]> {
    const v = actor.viewer;
    const mayRead =
      v.kind === 'system' ||
      ((v.kind === 'user' || v.kind === 'token') && (roleAtLeast(v.role, 'ADMIN') || v.user.id === token.userId));
    if (!mayRead) return [];
    const scope = `key:${token.id}`;
    const rows = this.deps.enforcer.rules().filter((r) => r.scope === scope);
    if (!rows.length) return [];
    const full = await this.deps.db.limit.findMany({ where: { scope } });
    const label = rows[0]?.label ?? scope;
    return full.map((r) => this.view(r, label));
  }

  private view(row: Limit, scopeLabel: string): LimitView {
    const now = this.deps.enforcer.remaining().filter((u) => u.rule.id === row.id);
    const refused = this.deps.enforcer
      .refusalCounts()
      .filter((c) => c.rule.id === row.id)
      .reduce((a, c) => a + c.count, 0);
    const values = valuesOf(row);
    const usage: LimitUsage[] = (Object.keys(values) as LimitKind[]).map((kind) => {
      const seen = now.find((u) => u.kind === kind);
      const limit = values[kind] as number;
      const scale = kind === 'spendPerMonth' ? MONEY_SCALE : 1;
      return {
        kind,
        limit: limit / scale,
        used: (seen?.used ?? 0) / scale,
        remaining: (seen?.remaining ?? limit) / scale,
        resetAt: new Date(seen?.resetAt ?? 0),
      };
    });
    return { ...row, scopeLabel, usage, refused };
  }

  private adminOnly(actor: Actor, what: string): ForbiddenError | undefined {
    const v = actor.viewer;
    if (v.kind === 'system') return undefined;
    if ((v.kind === 'user' || v.kind === 'token') && roleAtLeast(v.role, 'ADMIN')) return undefined;
    return new ForbiddenError(`only an ADMIN may ${what}`);
  }
}

/** A row's limits, spend in millionths (MONEY_SCALE), the unset ones absent. */
export function valuesOf(row: Limit): Partial<Record<LimitKind, number>> {
  const out: Partial<Record<LimitKind, number>> = {};
  if (row.requestsPerMinute !== null) out.requestsPerMinute = row.requestsPerMinute;
  if (row.tokensPerMinute !== null) out.tokensPerMinute = row.tokensPerMinute;
  if (row.concurrentRequests !== null) out.concurrentRequests = row.concurrentRequests;
  if (row.tokensPerDay !== null) out.tokensPerDay = Number(row.tokensPerDay);
  if (row.tokensPerMonth !== null) out.tokensPerMonth = Number(row.tokensPerMonth);
  if (row.spendPerMonth !== null) out.spendPerMonth = Math.round(Number(row.spendPerMonth) * MONEY_SCALE);
  return out;
}

function describeValues(v: Partial<Record<LimitKind, number>>): string {
  return (Object.keys(v) as LimitKind[])
    .map((k) => `${k} ${k === 'spendPerMonth' ? ((v[k] as number) / MONEY_SCALE).toFixed(2) : v[k]}`)
    .join(', ');
}
