import type { Prisma } from '../generated/prisma/client.js';

/** A folder under server/src that owns tables: the only one that should read or write them directly. */
export type OwningDomain =
  | 'access'
  | 'audit'
  | 'auth'
  | 'catalog'
  | 'fleet'
  | 'gateway'
  | 'governance'
  | 'hf'
  | 'mirror'
  | 'org'
  | 'serve'
  | 'train';

/**
 * Each Prisma model's one owning domain, decided by who writes it. Another domain asks the owner (its service
 * or a snapshot it publishes) instead of touching the table; test/table-owners.test.ts holds every domain to
 * this, lists the crossings that remain, and checks docs/architecture.md ("Who owns which table") agrees.
 */
export const TABLE_OWNERS: Record<Prisma.ModelName, OwningDomain> = {
  User: 'access',
  ApiToken: 'access',
  Session: 'auth',
  LoginLimit: 'auth',
  AuditEvent: 'audit',
  CatalogModel: 'catalog',
  Adapter: 'catalog',
  ServedName: 'catalog',
  Node: 'fleet',
  Replica: 'fleet',
  EngineKey: 'fleet',
  NodeFile: 'fleet',
  NodePeer: 'fleet',
  GpuTime: 'fleet',
  ModelScale: 'fleet',
  UsageMinute: 'gateway',
  UsageSpool: 'gateway',
  UsageHour: 'gateway',
  UsageDay: 'gateway',
  UsageDayPrefix: 'gateway',
  UsageQuarter: 'gateway',
  GatewayLoad: 'gateway',
  Limit: 'governance',
  LimitWindow: 'governance',
  Price: 'governance',
  HubRef: 'hf',
  MirrorFile: 'mirror',
  MirrorUpload: 'mirror',
  Org: 'org',
  Team: 'org',
  Project: 'org',
  Membership: 'org',
  Collection: 'org',
  CollectionDocument: 'org',
  KbDataset: 'org',
  ServeJob: 'serve',
  ServeJobStep: 'serve',
  TrainJob: 'train',
  TrainMetric: 'train',
  TrainEvent: 'train',
  TrainArtifact: 'train',
  TrainEvaluation: 'train',
};
