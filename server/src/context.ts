import type { Logger } from '@hangar/common/log';
import type { YogaInitialContext } from 'graphql-yoga';
import type { AccessService } from './access/access.service.js';
import type { AuditService } from './audit/audit.service.js';
import type { Actor } from './auth/actor.js';
import type { AuthService } from './auth/auth.service.js';
import type { LiveConnection } from './auth/live.js';
import type { Viewer } from './auth/viewer.js';
import type { CatalogService } from './catalog/catalog.service.js';
import type { Config } from './config.js';
import type { Db } from './db/client.js';
import type { FleetService } from './fleet/fleet.service.js';
import type { PeerService } from './fleet/peers.service.js';
import type { Gateway } from './gateway/gateway.js';
import type { UsageService } from './gateway/usage.service.js';
import type { CostService } from './governance/cost.service.js';
import type { LimitsService } from './governance/limits.service.js';
import type { MirrorService } from './mirror/mirror.service.js';
import type { KbDatasets } from './org/kb-datasets.js';
import type { KbDocuments } from './org/kb-documents.js';
import type { OrgService } from './org/org.service.js';
import type { PubSub } from './pubsub.js';
import type { RegistryService } from './registry/registry.service.js';
import type { ServeJobService } from './serve/serve-job.service.js';
import type { TrainArtifacts } from './train/artifacts.js';
import type { TrainService } from './train/train.service.js';

export type Services = {
  audit: AuditService;
  auth: AuthService;
  access: AccessService;
  org: OrgService;
  kb: KbDocuments;
  kbDatasets: KbDatasets;
  fleet: FleetService;
  peers: PeerService;
  gateway: Gateway;
  mirror: MirrorService;
  registry: RegistryService;
  catalog: CatalogService;
  serveJobs: ServeJobService;
  train: TrainService;
  trainArtifacts: TrainArtifacts;
  usage: UsageService;
  limits: LimitsService;
  cost: CostService;
};

/** What every request carries: built once per HTTP request or WebSocket operation, by the same code. */
export type Context = YogaInitialContext & {
  prisma: Db;
  config: Config;
  log: Logger;
  pubsub: PubSub;
  services: Services;
  viewer: Viewer;
  requestId: string;
  /** What resolvers hand the services: the viewer, the request id and where the request came from. */
  actor: Actor;
  /** Cookies a resolver wants set on the response (login, logout); HTTP only. */
  responseCookies: string[];
  /** Whether the request came over TLS (directly or as a proxy says), so cookies are marked Secure. */
  secure: boolean;
  /** The WebSocket connection an operation came on (graphql/ws.ts); SSE requests have none. */
  live?: LiveConnection;
  /**
   * The client's address: the socket's peer, or with HANGAR_TRUST_PROXY the address the proxy in front
   * reports. What sign-in attempts are counted against; undefined for requests made in-process.
   */
  clientAddress?: string;
};
