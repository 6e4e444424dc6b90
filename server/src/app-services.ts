import type { Logger } from '@hangar/common/log';
import { AccessService } from './access/access.service.js';
import type { AuditService } from './audit/audit.service.js';
import { AuthService } from './auth/auth.service.js';
import type { LoginLimits } from './auth/login-limits.js';
import { CatalogService } from './catalog/catalog.service.js';
import type { Config } from './config.js';
import type { Services } from './context.js';
import type { Db } from './db/client.js';
import { FleetService } from './fleet/fleet.service.js';
import { PeerService } from './fleet/peers.service.js';
import { UsageService } from './gateway/usage.service.js';
import { CostService } from './governance/cost.service.js';
import { buildLimits } from './governance/limits-build.js';
import { MirrorService } from './mirror/mirror.service.js';
import { KbDatasets } from './org/kb-datasets.js';
import { KbDocuments } from './org/kb-documents.js';
import { OrgService } from './org/org.service.js';
import { RegistryService } from './registry/registry.service.js';
import { SourceLook } from './registry/source-look.js';
import { ServeJobService } from './serve/serve-job.service.js';
import { TrainArtifacts } from './train/artifacts.js';
import { TrainService } from './train/train.service.js';
import { TrainLedger } from './train/train-ledger.js';

// The services, each built once, in the order their constructors need one another (app.ts's createApp calls this
// first). The gateway is added by createApp, once the metrics and tracing it reports to exist.

export function buildServices({
  prisma,
  audit,
  config,
  log,
  loginLimits,
}: {
  prisma: Db;
  audit: AuditService;
  config: Config;
  log: Logger;
  loginLimits: LoginLimits;
}): Services {
  // Training's ledger comes first: the fleet fails a removed node's jobs through it, and training needs the fleet.
  const trainLedger = new TrainLedger({ db: prisma, audit });
  const services: Services = {
    audit,
    auth: new AuthService(prisma, config, audit, log, loginLimits),
    access: new AccessService(prisma, audit),
    org: new OrgService({ db: prisma, audit }),
    fleet: new FleetService({
      db: prisma,
      audit,
      log,
      train: trainLedger,
      gpuMemoryMargin: config.gpuMemoryMargin,
      drainGraceMs: config.drainGraceSeconds * 1000,
      placementRereadMs: config.placementRereadSeconds * 1000,
    }),
    usage: new UsageService({ db: prisma, retention: config.usageRetention, log }),
    peers: new PeerService({ db: prisma, audit }),
  } as Services;
  services.kb = new KbDocuments({
    db: prisma,
    audit,
    org: services.org,
    limits: { documentMaxBytes: config.kbDocumentMaxBytes, collectionMaxBytes: config.kbCollectionMaxBytes },
  });
  // The GGUF header reads the explorer and a fetch by URL share (they know the nodes' llama.cpp): built before the
  // mirror and the registry, so the mirror is given the look without the registry, which needs the mirror.
  const sourceLook = new SourceLook({ config, fleet: services.fleet });
  // After the org and the fleet it asks, before the registry and everything else that fetches into it.
  services.mirror = new MirrorService({
    db: prisma,
    audit,
    config,
    log,
    // Bytes an owner owns are linked into another version only for a requester that owner admits.
    mayRead: (viewer, owner) => services.org.mayRead(viewer, owner),
    // A fetch by URL reads each GGUF's header first, with the reader the explorer uses.
    lookBeforeFetch: (files) => sourceLook.lookAtSources(files),
  });
  services.registry = new RegistryService({ config, fleet: services.fleet, mirror: services.mirror, look: sourceLook });
  services.catalog = new CatalogService({
    db: prisma,
    audit,
    config,
    mirror: services.mirror,
    fleet: services.fleet,
    log,
    org: services.org,
  });
  services.serveJobs = new ServeJobService({
    db: prisma,
    audit,
    registry: services.registry,
    mirror: services.mirror,
    catalog: services.catalog,
    log,
    fleet: services.fleet,
  });
  services.train = new TrainService({
    db: prisma,
    audit,
    config,
    fleet: services.fleet,
    mirror: services.mirror,
    registry: services.registry,
    owners: services.org,
    log,
    ledger: trainLedger,
  });
  // After training, which keeps the pairs it writes; it calls models through the gateway (app.ts gives its address).
  services.kbDatasets = new KbDatasets({ db: prisma, audit, org: services.org, train: services.train });
  // Prices and cost (governance/cost.service.ts): after usage, the org and the catalog it reads through; before the
  // limits, whose spend budgets price tokens with services.cost.pricing (governance/pricing.ts).
  services.cost = new CostService({
    db: prisma,
    audit,
    config,
    log,
    usage: services.usage,
    catalog: services.catalog,
    org: services.org,
  });
  // After the org (scopes) and the catalog (model names); the gateway is given its enforcer in app.ts.
  services.limits = buildLimits({
    db: prisma,
    audit,
    config,
    log,
    org: services.org,
    catalog: services.catalog,
    pricing: () => services.cost.pricing,
  });
  services.trainArtifacts = new TrainArtifacts({
    db: prisma,
    audit,
    train: services.train,
    mirror: services.mirror,
    log,
    names: services.catalog.names,
  });
  return services;
}
