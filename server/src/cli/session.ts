import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type GraphqlAnswer, GraphqlHttp, GraphqlUnanswered } from '@hangar/common/client/http';
import type { TadaDocumentNode } from 'gql.tada';
import { print } from 'graphql';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { CliError, EXIT } from './exit-codes.js';

// Where the CLI finds its server and token. The only file of the CLI that reads the environment, as config.ts
// is for the server: HANGAR_URL and HANGAR_TOKEN (for CI, containers) win over what `hangar login` stored.

export type Credentials = { url: string; token: string };

/** ~/.config/hangar/credentials.json, or under XDG_CONFIG_HOME where it is set. */
export function credentialsFile(env: NodeJS.ProcessEnv = process.env) {
  const base = env.XDG_CONFIG_HOME || path.join(env.HOME || os.homedir(), '.config');
  return path.join(base, 'hangar', 'credentials.json');
}

/**
 * Keeps the token, and says (through `note`) when the directory had to be tightened. The directory is made 0700
 * and the file 0600; a directory of the user's own that others could write is set to 0700 first: in one, any
 * user could rename a credentials.json of theirs over this one, naming their server, and the next command would
 * send the token there. One that is not the user's, or not a directory, is refused.
 */
export async function saveCredentials(
  c: Credentials,
  env: NodeJS.ProcessEnv = process.env,
  note: (line: string) => void = () => {},
) {
  const file = credentialsFile(env);
  const dir = path.dirname(file);
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  const loose = await othersMayWrite(dir);
  if (loose !== null) {
    await fs.chmod(dir, 0o700);
    note(
      `hangar: ${dir} was writable by other users (mode ${loose.toString(8)}), so any of them could have replaced the token kept there; it is now 700`,
    );
  }
  // Written to a new file and renamed, mode 0600 from the start: the token is as good as the user's password
  // for what its role allows, and a file readable by others for even a moment is a leak. 'wx': a name someone
  // made in advance (a link to elsewhere) is refused, not written through.
  const tmp = `${file}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  await fs.writeFile(tmp, `${JSON.stringify(c, null, 2)}\n`, { mode: 0o600, flag: 'wx' });
  await fs.chmod(tmp, 0o600);
  await fs.rename(tmp, file);
  return file;
}

/**
 * The mode of a directory other users may write (group or world write bit), or null when only its owner may.
 * Refuses one that is not the user's own directory: its owner decides what is in it. Not checked where there
 * are no POSIX owners (Windows).
 */
async function othersMayWrite(dir: string): Promise<number | null> {
  const uid = process.getuid?.();
  if (uid === undefined) return null;
  const st = await fs.lstat(dir);
  if (!st.isDirectory())
    throw new CliError(`${dir} is not a directory (a link?): remove it, then run \`hangar login\` again`, EXIT.auth);
  if (st.uid !== uid)
    throw new CliError(
      `${dir} belongs to another user (uid ${st.uid}), who could replace the token kept there: remove it, then run \`hangar login\` again`,
      EXIT.auth,
    );
  const mode = st.mode & 0o777;
  return mode & 0o022 ? mode : null;
}

export async function loadCredentials(env: NodeJS.ProcessEnv = process.env): Promise<Credentials> {
  const fromEnv = { url: env.HANGAR_URL, token: env.HANGAR_TOKEN };
  const stored = fromEnv.url && fromEnv.token ? {} : await readStored(env);
  const url = fromEnv.url || stored.url;
  const token = fromEnv.token || stored.token;
  if (!url || !token)
    throw new CliError(
      'not signed in: run `hangar login URL` (or set HANGAR_URL and HANGAR_TOKEN)',
      EXIT.auth,
      'UNAUTHENTICATED',
    );
  return { url: normalizeUrl(url), token };
}

/** What `hangar login` kept, or nothing; only from a directory that only the user can write. */
async function readStored(env: NodeJS.ProcessEnv): Promise<Partial<Credentials>> {
  const file = credentialsFile(env);
  try {
    const dir = path.dirname(file);
    const loose = await othersMayWrite(dir);
    // From any other, the file may be another user's, naming their server: the token would go there.
    if (loose !== null)
      throw new CliError(
        `${dir} is writable by other users (mode ${loose.toString(8)}), so the server and token kept there may not be yours: run \`chmod 700 ${dir}\`, then \`hangar login\` again`,
        EXIT.auth,
      );
    return JSON.parse(await fs.readFile(file, 'utf8'));
  } catch (err) {
    if (err instanceof CliError) throw err;
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw new CliError(`${file} could not be read: ${(err as Error).message}`, EXIT.auth);
  }
}

/** The server's base URL as typed ("hangar:4000", "https://hangar.example/"), as http(s)://host[:port]. */
export function normalizeUrl(raw: string) {
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(raw) ? raw : `http://${raw}`;
  let u: URL;
  try {
    u = new URL(withScheme);
  } catch {
    throw new CliError(`"${raw}" is not a server address: give one such as http://hangar:4000`, EXIT.usage);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new CliError(`the server address is http:// or https://: "${raw}" is not`, EXIT.usage);
  return `${u.origin}${u.pathname.replace(/\/+$/, '')}`;
}

type Vars<V> = V extends Record<string, never> ? Record<string, never> | undefined : V;

/**
 * GraphQL over HTTP for queries and mutations (@hangar/common/client/http, as the node agent sends it), graphql-ws
 * for subscriptions, with the bearer token.
 */
export class HangarClient {
  private readonly http: GraphqlHttp;

  constructor(
    readonly url: string,
    readonly token: string,
  ) {
    this.http = new GraphqlHttp({ url, token, print, timeoutMs: 30_000 });
  }

  async request<R, V>(doc: TadaDocumentNode<R, V>, variables?: Vars<V>, headers: Record<string, string> = {}) {
    const { data } = await this.send(doc, variables, headers);
    return data as R;
  }

  /** As request, with the response's headers (login reads its cookies). */
  async send<R, V>(doc: TadaDocumentNode<R, V>, variables?: Vars<V>, headers: Record<string, string> = {}) {
    let answer: GraphqlAnswer;
    try {
      answer = await this.http.post(doc, variables as V | undefined, { headers });
    } catch (err) {
      if (!(err instanceof GraphqlUnanswered)) throw err;
      throw new CliError(
        `${this.url} did not answer (${err.detail}): is the server running, and is the address right?`,
        EXIT.unreachable,
      );
    }
    const { status, text, body } = answer;
    if (status === 401 || status === 403)
      throw new CliError(
        `${this.url} refused the token (${body?.errors?.[0]?.message ?? status}): run \`hangar login\` again`,
        EXIT.auth,
        'UNAUTHENTICATED',
      );
    if (!body || status >= 500)
      throw new CliError(
        `${this.url} answered ${status} ${text.slice(0, 120)}: is this a Hangar server?`,
        EXIT.unreachable,
      );
    if (body.errors?.length) {
      const code = body.errors[0]?.extensions?.code;
      throw new CliError(
        body.errors.map((e) => e.message).join('; '),
        code === 'UNAUTHENTICATED' || code === 'FORBIDDEN' ? EXIT.auth : EXIT.failed,
        code,
      );
    }
    return { data: body.data as R, headers: answer.headers };
  }

  /**
   * A subscription's events as an async iterator. Ending the loop (break, return) unsubscribes; the server's
   * work is not touched by that, which is what Ctrl-C relies on.
   */
  async *subscribe<R, V>(doc: TadaDocumentNode<R, V>, variables?: Vars<V>): AsyncGenerator<R> {
    const client = createClient({
      url: `${this.url.replace(/^http/, 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${this.token}` },
      retryAttempts: 5,
      // Long downloads outlive a network blip: reconnect and carry on instead of failing the watch.
      shouldRetry: () => true,
      lazy: true,
    });
    const events = client.iterate<R>({
      query: print(doc),
      variables: (variables ?? {}) as Record<string, unknown>,
    });
    try {
      for await (const e of events) {
        if (e.errors?.length) throw new CliError(e.errors.map((x) => x.message).join('; '), EXIT.failed);
        if (e.data) yield e.data as R;
      }
    } catch (err) {
      if (err instanceof CliError) throw err;
      throw new CliError(`the event stream from ${this.url} broke: ${describe(err)}`, EXIT.unreachable);
    } finally {
      await events.return?.(undefined);
      await client.dispose();
    }
  }
}

function describe(err: unknown) {
  if (err instanceof Error) return err.message;
  const close = err as { code?: number; reason?: string };
  if (typeof close?.code === 'number') return `closed ${close.code} ${close.reason ?? ''}`.trim();
  return String(err);
}

export async function connect(env: NodeJS.ProcessEnv = process.env) {
  const c = await loadCredentials(env);
  return new HangarClient(c.url, c.token);
}
