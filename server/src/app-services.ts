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
import { UsageService } from './gateway/usage.service.js';
import { MirrorService } from './mirror/mirror.service.js';
import { OrgService } from './org/org.service.js';
import { RegistryService } from './registry/registry.service.js';
import { ServeJobService } from './serve/serve-job.service.js';
import { TrainArtifacts } from './train/artifacts.js';
import { TrainService } from './train/train.service.js';

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
  const services: Services = {
    audit,
    auth: new AuthService(prisma, config, audit, log, loginLimits),
    access: new AccessService(prisma, audit),
    org: new OrgService(prisma, audit),
    fleet: new FleetService(prisma, audit, log),
    mirror: new MirrorService(prisma, audit, config, log),
    usage: new UsageService(prisma),
  } as Services;
  services.registry = new RegistryService(config, services.fleet, services.mirror);
  // A fetch by URL reads each GGUF's header first, with the reader the explorer uses (it knows the nodes' llama.cpp).
  services.mirror.lookBeforeFetch((files) => services.registry.lookAtSources(files));
  // Bytes an owner owns are linked into another version only for a requester that owner admits.
  services.mirror.readOwnersWith(services.org);
  services.catalog = new CatalogService(prisma, audit, config, services.mirror, services.fleet, log, services.org);
  services.serveJobs = new ServeJobService(
    prisma,
    audit,
    services.registry,
    services.mirror,
    services.catalog,
    log,
    undefined,
    services.fleet,
  );
  services.train = new TrainService(
    prisma,
    audit,
    config,
    services.fleet,
    services.mirror,
    services.registry,
    services.org,
    log,
  );
  services.trainArtifacts = new TrainArtifacts(
    prisma,
    audit,
    services.train,
    services.mirror,
    log,
    services.catalog.names,
  );
  return services;
}
