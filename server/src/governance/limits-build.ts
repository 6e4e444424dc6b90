import type { Logger } from '@hangar/common/log';
import type { AuditService } from '../audit/audit.service.js';
import type { CatalogService } from '../catalog/catalog.service.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import type { OrgService } from '../org/org.service.js';
import { LimitsService } from './limits.service.js';
import { LimitEnforcer } from './limits-enforcer.js';
import { LimitGate } from './limits-gate.js';
import { LimitLedger } from './limits-ledger.js';
import { PriorityGate } from './limits-priority.js';
import { RefusalTally } from './limits-refusers.js';
import type { Pricing } from './pricing.js';

// Limits, put together: the ledger (PostgreSQL's side), the enforcer (the request path's), the service (what
// admins change and everyone reads) and the gate the gateway calls. One function so that app-services.ts gives
// it one line.

export function buildLimits(deps: {
  db: Db;
  audit: AuditService;
  config: Config;
  log: Logger;
  org: OrgService;
  catalog: Pick<CatalogService, 'names'>;
  /** Prices per million tokens for spendPerMonth (governance/pricing.ts), once cost is built. */
  pricing?: () => Pricing | undefined;
}): LimitsService {
  const ledger = new LimitLedger({ db: deps.db });
  let service: LimitsService | undefined;
  // Who each limit refuses, per caller, over the last minute window (Limit.refusedBy).
  const refusers = new RefusalTally({
    minuteMs: () => deps.config.limitMinuteSeconds * 1000,
    nowMs: () => deps.db.clock.nowMs(),
  });
  const enforcer = new LimitEnforcer({
    ledger,
    log: deps.log,
    nowMs: () => deps.db.clock.nowMs(),
    minuteMs: deps.config.limitMinuteSeconds * 1000,
    pricing: deps.pricing,
    onRefused: (rule, kind, caller) => {
      service?.noteRefusal(rule, kind);
      refusers.note(rule.id, kind, caller);
    },
  });
  service = new LimitsService({
    db: deps.db,
    audit: deps.audit,
    org: deps.org,
    log: deps.log,
    enforcer,
    refusers,
    nameExists: async (name) => (await deps.catalog.names.holder(name)) !== null,
    gate: new LimitGate({
      enforcer,
      priority: new PriorityGate(),
      batchWaitMs: deps.config.gatewayWakeSeconds * 1000,
    }),
  });
  return service;
}
