import type { Logger } from '@hangar/common/log';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import type { LoopHealth } from '../db/outage.js';
import type { MirrorPaths } from './paths.js';
import type { MirrorSpace } from './space.js';
import type { MirrorStorage } from './storage.js';

/**
 * What the landing (mirror-landing.ts) and the workers (mirror-worker.ts) are both given, one of each per service
 * (mirror.service.ts builds them): two parts that disagreed about the storage, the lease owner or the room on the
 * disk would each be right about a file and wrong together.
 */
export type MirrorGround = {
  db: Db;
  config: Config;
  log: Logger;
  paths: MirrorPaths;
  storage: MirrorStorage;
  /** This process's lease owner: its claims and renewals go under it, and a file's end is written only while it holds. */
  owner: string;
  /** The database's reachability as the loops meet it: claims pause and a landing's writes wait out an outage. */
  health: LoopHealth;
  /** Aborted when the server stops (MirrorService.stop): a transfer cut off then goes back to the queue, not CANCELLED. */
  shutdown: AbortSignal;
  space: MirrorSpace;
};
