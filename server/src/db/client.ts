import { PrismaPg } from '@prisma/adapter-pg';
import { PrismaClient } from '../generated/prisma/client.js';

export type Db = PrismaClient;
/** A transaction client, as `db.$transaction(async (tx) => …)` hands it over. */
export type Tx = Parameters<Parameters<PrismaClient['$transaction']>[0]>[0];

export function createPrisma(databaseUrl: string): Db {
  return new PrismaClient({ adapter: new PrismaPg({ connectionString: databaseUrl, max: 20 }) });
}
