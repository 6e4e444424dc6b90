import { randomBytes } from 'node:crypto';
import { hash, verify } from '@node-rs/argon2';

// Passwords are low-entropy and chosen by people: argon2id, slow on purpose. Tokens and session ids are 256
// random bits: a plain sha256 is enough to make a stolen table useless, and cheap enough to check per request.

export async function hashPassword(password: string): Promise<string> {
  // @node-rs/argon2 hashes with argon2id unless told otherwise (its Algorithm is a const enum that a per-file
  // compiler cannot inline). The costs are OWASP's recommended minimum for argon2id.
  return hash(password, { memoryCost: 19456, timeCost: 2, parallelism: 1 });
}

export async function verifyPassword(stored: string, password: string): Promise<boolean> {
  try {
    return await verify(stored, password);
  } catch {
    return false;
  }
}

export type SecretKind = 'api' | 'node' | 'session';
const prefixes: Record<SecretKind, string> = { api: 'hgr_', node: 'hgn_', session: '' };

export function newSecret(kind: SecretKind): string {
  return prefixes[kind] + randomBytes(32).toString('base64url');
}

export function secretKind(secret: string): SecretKind | undefined {
  if (secret.startsWith('hgr_')) return 'api';
  if (secret.startsWith('hgn_')) return 'node';
  return undefined;
}

// Shared with the node agent, which checks its engines' API keys the same way (packages/common).
export { hashSecret, sameSecret } from '@hangar/common/secret-hash';
