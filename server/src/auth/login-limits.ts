import pg from 'pg';
import { RateLimiterPostgres, RateLimiterRes } from 'rate-limiter-flexible';
import { connectionOptions, SIGN_IN_POOL_SIZE } from '../db/connections.js';
import { hashSecret } from './secrets.js';

// Without a limit a guesser got 17–34 tries a second at the console's password. Refused sign-ins are counted
// in PostgreSQL (the LoginLimit table, made by a migration), so every replica behind a load balancer shares
// the count and a restart does not wipe it. Three counts, each in a fixed window:
// - one account from one address: the guesser at one password; an operator who mistypes gets plenty of room;
// - one address, any account: the guesser trying one password on many accounts;
// - one account, any address: the guesser spread over many addresses. This one lets such a guesser keep the
//   account's owner out of the console for the rest of the hour; API tokens still work, and 100 refusals in
//   an hour is an attack worth the admin's attention in the audit log.
export const loginLimits = {
  accountAddress: { points: 10, seconds: 15 * 60 },
  address: { points: 100, seconds: 60 * 60 },
  account: { points: 100, seconds: 60 * 60 },
} as const;

type Which = keyof typeof loginLimits;

export type LoginAttempt = { email: string; address: string | undefined };

export type LoginVerdict =
  | { ok: true; succeeded: () => Promise<void> }
  | { ok: false; which: Which; retryAfterSeconds: number };

export class LoginLimits {
  private readonly pool: pg.Pool;
  private readonly limiters: Record<Which, RateLimiterPostgres>;

  constructor(databaseUrl: string) {
    // A small pool of its own: the library speaks to pg directly, and sign-ins are few.
    this.pool = new pg.Pool({ connectionString: databaseUrl, max: SIGN_IN_POOL_SIZE, ...connectionOptions('signIns') });
    this.pool.on('error', () => {
      // An idle connection dropped (the database restarted): the pool opens another on the next query.
    });
    const limiter = (which: Which) =>
      new RateLimiterPostgres({
        storeClient: this.pool,
        storeType: 'pool',
        tableName: 'LoginLimit',
        // The migration made the table: no DDL at run time, so the server needs no CREATE privilege.
        tableCreated: true,
        keyPrefix: `login-${which}`,
        points: loginLimits[which].points,
        duration: loginLimits[which].seconds,
      });
    this.limiters = {
      accountAddress: limiter('accountAddress'),
      address: limiter('address'),
      account: limiter('account'),
    };
  }

  /**
   * Counts a sign-in attempt before its password is checked, so a burst sent all at once is counted as it
   * arrives rather than after it has been let through. A refused attempt writes nothing: a guesser who keeps
   * knocking once refused neither fills the table nor spends the account's count for everyone else.
   */
  async attempt(a: LoginAttempt): Promise<LoginVerdict> {
    const keys = this.keys(a);
    const order: Which[] = ['accountAddress', 'address', 'account'];
    const now = await Promise.all(order.map((w) => this.limiters[w].get(keys[w])));
    for (const [i, w] of order.entries()) {
      const res = now[i];
      if (res && res.consumedPoints >= loginLimits[w].points) return refused(w, res);
    }
    const consumed = await Promise.allSettled(order.map((w) => this.limiters[w].consume(keys[w])));
    for (const [i, w] of order.entries()) {
      const r = consumed[i];
      if (r?.status !== 'rejected') continue;
      // Lost a race with another attempt for the last place.
      if (r.reason instanceof RateLimiterRes) return refused(w, r.reason);
      throw r.reason;
    }
    return {
      ok: true,
      // A right password gives the attempt back, and clears the count for this account from this address:
      // the operator who mistyped nine times and then got it right starts afresh.
      succeeded: async () => {
        await Promise.all([
          this.limiters.accountAddress.delete(keys.accountAddress),
          this.limiters.address.reward(keys.address),
          this.limiters.account.reward(keys.account),
        ]);
      },
    };
  }

  async close(): Promise<void> {
    await this.pool.end().catch(() => {});
  }

  private keys({ email, address }: LoginAttempt): Record<Which, string> {
    // Hashed: an email can be longer than the key column, and the table need not hold the addresses.
    const account = hashSecret(email).slice(0, 32);
    const from = address ?? 'in-process';
    return { accountAddress: `${account}:${from}`, address: from, account };
  }
}

function refused(which: Which, res: RateLimiterRes): LoginVerdict {
  return { ok: false, which, retryAfterSeconds: Math.max(1, Math.ceil(res.msBeforeNext / 1000)) };
}
