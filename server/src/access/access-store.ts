import type { Db, Tx } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';

// The users and API tokens tables belong to access (db/owners.ts). Other domains read and write them only
// through these functions, so a change to their columns is made here once and test/table-owners.test.ts can
// hold every other folder to it. Each takes the client to use: a caller's transaction when the read or write
// must commit (or roll back) with the caller's own, the requests' or loops' client otherwise.

type Client = Db | Tx;

/** A user by id, with the relations a GraphQL selection asks for (Pothos hands `query` over). */
export function userById(db: Client, id: string, query: Pick<Prisma.UserFindUniqueArgs, 'include' | 'select'> = {}) {
  return db.user.findUnique({ ...query, where: { id } } as Prisma.UserFindUniqueArgs);
}

/** As userById, for a user that must exist (a signed-in caller): throws otherwise. */
export function userByIdOrThrow(
  db: Client,
  id: string,
  query: Pick<Prisma.UserFindUniqueArgs, 'include' | 'select'> = {},
) {
  return db.user.findUniqueOrThrow({ ...query, where: { id } } as Prisma.UserFindUniqueArgs);
}

/** A user by their email (stored lower-case). */
export function userByEmail(db: Client, email: string) {
  return db.user.findUnique({ where: { email } });
}

/** Users by id, in one query (owner names, a job's creator). */
export function usersByIds(db: Client, ids: string[]) {
  return ids.length ? db.user.findMany({ where: { id: { in: ids } } }) : Promise.resolve([]);
}

/** How many users exist: zero means a fresh install that needs its first admin. */
export function userCount(db: Client) {
  return db.user.count();
}

/** A password change, in the caller's transaction (it ends sessions and audits in the same one). */
export function setPassword(tx: Tx, userId: string, passwordHash: string) {
  return tx.user.update({ where: { id: userId }, data: { passwordHash } });
}

/** The first admin of a fresh install, in the caller's transaction (under its lock, audited there). */
export function createFirstAdmin(tx: Tx, email: string, passwordHash: string) {
  return tx.user.create({ data: { email, name: 'Administrator', role: 'ADMIN', passwordHash } });
}

/** An API token by the hash of its secret, with its user: how a bearer secret is identified. */
export function tokenByHash(db: Client, tokenHash: string) {
  return db.apiToken.findUnique({ where: { tokenHash }, include: { user: true } });
}

/** An API token by id, with its user (named as an owner or a member). */
export function tokenById(db: Client, id: string) {
  return db.apiToken.findUnique({ where: { id }, include: { user: true } });
}

/** API tokens by id, with their users, in one query. */
export function tokensByIds(db: Client, ids: string[]) {
  return ids.length
    ? db.apiToken.findMany({ where: { id: { in: ids } }, include: { user: true } })
    : Promise.resolve([]);
}

/** Stamps a token's last use. */
export async function touchToken(db: Client, id: string, at: Date): Promise<void> {
  await db.apiToken.update({ where: { id }, data: { lastUsedAt: at } });
}

/** SQL for the ids (as text) of a user's API tokens, for a statement of another domain to test membership in. */
export function tokenIdsOfUserSql(userId: string): Prisma.Sql {
  return Prisma.sql`SELECT "id"::text FROM "ApiToken" WHERE "userId" = ${userId}::uuid`;
}
