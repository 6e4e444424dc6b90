import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { freePort } from '@hangar/common/free-port';
import pg from 'pg';
import { until } from '../fixtures/server-process.js';

// PostgreSQL made highly available the way sites do it, from Debian's packages: etcd holds the leader key, two
// Patroni members each run a PostgreSQL 15 (one primary, one synchronous standby), and HAProxy's read-write port
// sends connections to whichever member Patroni's REST API says is the primary (`GET /primary` answers 200 only
// there). Hangar is pointed at HAProxy, as an operator would point DATABASE_URL at it. Not a stand-in: the real
// programs, on loopback, with short timings (ttl 8 s, loop_wait 1 s) so that a failover takes seconds.

const run = promisify(execFile);
const PG_BIN = '/usr/lib/postgresql/15/bin';

export type Member = {
  name: string;
  pgPort: number;
  restPort: number;
  dataDir: string;
  patroni: ChildProcess;
  /** Everything Patroni (and PostgreSQL under it) printed. */
  output: string[];
};

export type PatroniCluster = {
  members: Member[];
  /** HAProxy's read-write port: what DATABASE_URL names. */
  url: (db: string) => string;
  /** The member Patroni's REST API calls the primary now, if any answers so. */
  leader: () => Promise<Member | undefined>;
  /**
   * The leader's machine dies: kill -9 its Patroni and every process of its PostgreSQL at once (the postmaster
   * is a session leader, so its process group is all of them), nothing shut down, nothing handed over.
   */
  killMember: (m: Member) => void;
  logs: () => string;
  stop: () => Promise<void>;
};

type Proc = { proc: ChildProcess; output: string[] };

/** Starts etcd, `count` Patroni members and HAProxy under `root` (a directory PostgreSQL's user may enter). */
export async function startPatroniCluster(root: string, count = 2): Promise<PatroniCluster> {
  // PostgreSQL refuses to run as root: Patroni (and so PostgreSQL) runs as Debian's postgres user then.
  const as = process.getuid?.() === 0 ? await postgresUser() : undefined;
  const procs: Proc[] = [];
  const start = (cmd: string, args: string[], opts: { uid?: number; gid?: number } = {}): Proc => {
    const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
    const output: string[] = [];
    proc.stdout?.on('data', (d) => output.push(String(d)));
    proc.stderr?.on('data', (d) => output.push(String(d)));
    const p = { proc, output };
    procs.push(p);
    return p;
  };
  const password = randomBytes(12).toString('hex');
  const etcdClient = await freePort();
  const etcdPeer = await freePort();
  const etcdDir = path.join(root, 'etcd');
  const etcd = start('etcd', [
    '--name=failover',
    `--data-dir=${etcdDir}`,
    `--listen-client-urls=http://127.0.0.1:${etcdClient}`,
    `--advertise-client-urls=http://127.0.0.1:${etcdClient}`,
    `--listen-peer-urls=http://127.0.0.1:${etcdPeer}`,
    `--initial-advertise-peer-urls=http://127.0.0.1:${etcdPeer}`,
    `--initial-cluster=failover=http://127.0.0.1:${etcdPeer}`,
    '--log-level=warn',
  ]);
  await until(
    'etcd to answer',
    async () => (await get(`http://127.0.0.1:${etcdClient}/health`)) === 200 || undefined,
    20_000,
  ).catch(() => {
    throw new Error(`etcd did not start: ${etcd.output.join('')}`);
  });

  const members: Member[] = [];
  for (let i = 1; i <= count; i++) {
    const name = `m${i}`;
    const dir = path.join(root, name);
    await fs.mkdir(dir, { recursive: true, mode: 0o755 });
    if (as) await fs.chown(dir, as.uid, as.gid);
    const pgPort = await freePort();
    const restPort = await freePort();
    const dataDir = path.join(dir, 'data');
    const config = patroniConfig({ name, dir, dataDir, pgPort, restPort, etcdClient, password });
    const file = path.join(dir, 'patroni.yml');
    // JSON is YAML: no YAML library needed to write Patroni's configuration.
    await fs.writeFile(file, JSON.stringify(config, null, 2));
    const p = start('patroni', [file], as ?? {});
    members.push({ name, pgPort, restPort, dataDir, patroni: p.proc, output: p.output });
    // The first member bootstraps the cluster (initdb) before the next one copies it: one initdb, not a race.
    if (i === 1) await waitFor(members[0] as Member, 'primary', 60_000);
  }
  for (const m of members.slice(1)) await waitFor(m, 'replica', 60_000);

  const haPort = await freePort();
  const statsPort = await freePort();
  const haConfig = path.join(root, 'haproxy.cfg');
  await fs.writeFile(haConfig, haproxyConfig(haPort, statsPort, members));
  const haproxy = start('haproxy', ['-db', '-f', haConfig]);
  const url = (db: string) => `postgresql://postgres:${password}@127.0.0.1:${haPort}/${db}`;
  // HAProxy takes every server as up until its checks say otherwise: until they have, a session could land on
  // the standby. So: until its own statistics have the primary up and every other member down.
  const primary = members[0] as Member;
  await until(
    'HAProxy to route to the primary alone',
    async () => {
      const states = await serverStates(statsPort);
      return members.every((m) => states.get(m.name) === (m === primary ? 'UP' : 'DOWN')) || undefined;
    },
    20_000,
  ).catch(async () => {
    const states = JSON.stringify([...(await serverStates(statsPort))]);
    throw new Error(`HAProxy did not settle on the primary: ${states} ${haproxy.output.join('')}`);
  });
  await until('a session through HAProxy', async () => (await canConnect(url('postgres'))) || undefined, 20_000).catch(
    () => {
      throw new Error(`HAProxy did not reach the primary: ${haproxy.output.join('')}`);
    },
  );

  const leader = async () => {
    for (const m of members) if ((await get(`http://127.0.0.1:${m.restPort}/primary`)) === 200) return m;
    return undefined;
  };
  return {
    members,
    url,
    leader,
    killMember: (m) => {
      const postmaster = postmasterPid(m);
      m.patroni.kill('SIGKILL');
      if (postmaster) killProcessTree(postmaster);
    },
    logs: () =>
      [
        `--- etcd\n${etcd.output.join('')}`,
        ...members.map((m) => `--- ${m.name}\n${m.output.join('').slice(-20_000)}`),
        `--- haproxy\n${haproxy.output.join('')}`,
      ].join('\n'),
    stop: async () => {
      // PostgreSQL first, through Patroni (SIGTERM: it stops its PostgreSQL fast), then the rest.
      for (const m of members) killQuietly(m.patroni, 'SIGTERM');
      await Promise.all(members.map((m) => exited(m.patroni, 15_000)));
      // A member killed by the test left its PostgreSQL to this.
      for (const m of members) {
        const pid = postmasterPid(m);
        if (pid) killProcessTree(pid);
      }
      killQuietly(haproxy.proc, 'SIGKILL');
      killQuietly(etcd.proc, 'SIGKILL');
      await Promise.all([exited(haproxy.proc, 5000), exited(etcd.proc, 5000)]);
    },
  };

  // The postmaster's pid, from the first line of postmaster.pid (read synchronously: it is needed at the kill).
  function postmasterPid(m: Member): number | undefined {
    try {
      const text = readFileSync(path.join(m.dataDir, 'postmaster.pid'), 'utf8');
      const pid = Number(text.split('\n')[0]);
      return Number.isInteger(pid) && pid > 0 ? pid : undefined;
    } catch {
      return undefined;
    }
  }
}

function patroniConfig(o: {
  name: string;
  dir: string;
  dataDir: string;
  pgPort: number;
  restPort: number;
  etcdClient: number;
  password: string;
}) {
  return {
    scope: 'hangar-failover',
    name: o.name,
    restapi: { listen: `127.0.0.1:${o.restPort}`, connect_address: `127.0.0.1:${o.restPort}` },
    etcd3: { hosts: [`127.0.0.1:${o.etcdClient}`] },
    bootstrap: {
      dcs: {
        // The leader key lives 8 s without a renewal: the standby takes over about that long after the leader
        // dies. Patroni's rule: loop_wait + 2 × retry_timeout ≤ ttl.
        ttl: 8,
        loop_wait: 1,
        retry_timeout: 3,
        // A commit returns only once the standby has it too, so the standby that takes over has every change
        // Hangar was told was committed. Without it a failover may lose the last transactions: no client can
        // make up for that.
        synchronous_mode: true,
        postgresql: {
          use_pg_rewind: false,
          parameters: { max_connections: 100, wal_level: 'replica', hot_standby: 'on', max_wal_senders: 5 },
        },
      },
      initdb: [{ encoding: 'UTF8' }, { locale: 'C' }],
      pg_hba: [
        'local all all trust',
        'host all all 127.0.0.1/32 scram-sha-256',
        'host replication replicator 127.0.0.1/32 scram-sha-256',
      ],
    },
    postgresql: {
      listen: `127.0.0.1:${o.pgPort}`,
      connect_address: `127.0.0.1:${o.pgPort}`,
      data_dir: o.dataDir,
      bin_dir: PG_BIN,
      pgpass: path.join(o.dir, 'pgpass'),
      authentication: {
        superuser: { username: 'postgres', password: o.password },
        replication: { username: 'replicator', password: o.password },
      },
      parameters: { unix_socket_directories: o.dir },
    },
    log: { level: 'WARNING' },
  };
}

function haproxyConfig(port: number, statsPort: number, members: Member[]) {
  return [
    'global',
    '  maxconn 400',
    'defaults',
    '  mode tcp',
    '  timeout connect 2s',
    '  timeout client 30m',
    '  timeout server 30m',
    '  timeout check 1s',
    'frontend stats',
    '  mode http',
    `  bind 127.0.0.1:${statsPort}`,
    '  stats enable',
    '  stats uri /stats',
    'listen primary',
    `  bind 127.0.0.1:${port}`,
    '  option httpchk GET /primary',
    '  http-check expect status 200',
    // A member whose REST API stops saying "primary" is out within a second, and the sessions still open to it
    // are cut, so no client goes on talking to a PostgreSQL that is no longer the primary.
    '  default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions',
    ...members.map((m) => `  server ${m.name} 127.0.0.1:${m.pgPort} check port ${m.restPort}`),
    '',
  ].join('\n');
}

async function waitFor(m: Member, role: 'primary' | 'replica', timeoutMs: number) {
  await until(
    `${m.name} to be ${role}`,
    async () => (await get(`http://127.0.0.1:${m.restPort}/${role}`)) === 200 || undefined,
    timeoutMs,
  ).catch(() => {
    throw new Error(`Patroni member ${m.name} did not become ${role}: ${m.output.join('')}`);
  });
}

/** Each member's state as HAProxy's checks have it (UP, DOWN, …), from its statistics as CSV. */
async function serverStates(statsPort: number): Promise<Map<string, string>> {
  try {
    const res = await fetch(`http://127.0.0.1:${statsPort}/stats;csv`, { signal: AbortSignal.timeout(1000) });
    const [header = '', ...rows] = (await res.text()).split('\n');
    const cols = header.replace(/^# /, '').split(',');
    const [px, sv, status] = ['pxname', 'svname', 'status'].map((c) => cols.indexOf(c));
    return new Map(
      rows
        .map((r) => r.split(','))
        .filter((r) => r[px as number] === 'primary')
        .map((r) => [r[sv as number] ?? '', (r[status as number] ?? '').split(' ')[0] ?? '']),
    );
  } catch {
    return new Map();
  }
}

async function get(url: string): Promise<number> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return 0;
  }
}

async function canConnect(url: string): Promise<boolean> {
  const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1000 });
  c.on('error', () => {});
  try {
    await c.connect();
    await c.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await c.end().catch(() => {});
  }
}

async function postgresUser(): Promise<{ uid: number; gid: number }> {
  const { stdout } = await run('id', ['postgres']);
  const uid = Number(stdout.match(/uid=(\d+)/)?.[1]);
  const gid = Number(stdout.match(/gid=(\d+)/)?.[1]);
  if (!Number.isInteger(uid) || !Number.isInteger(gid)) throw new Error(`no postgres user: ${stdout}`);
  return { uid, gid };
}

function killQuietly(proc: ChildProcess, signal: NodeJS.Signals) {
  try {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
  } catch {
    // Already gone.
  }
}

/**
 * SIGKILL to a postmaster and its children, together. Not its process group: each PostgreSQL child calls
 * setsid(), so the postmaster's group holds none of them.
 */
function killProcessTree(postmaster: number) {
  let children: number[] = [];
  try {
    const stat = (pid: string) => readFileSync(`/proc/${pid}/stat`, 'utf8');
    children = readdirSync('/proc')
      .filter((d) => /^\d+$/.test(d))
      .flatMap((d) => {
        try {
          // The parent's pid is the fourth field, after the command name in parentheses.
          const line = stat(d);
          const ppid = Number(line.slice(line.lastIndexOf(')') + 2).split(' ')[1]);
          return ppid === postmaster ? [Number(d)] : [];
        } catch {
          return [];
        }
      });
  } catch {
    // No /proc: the postmaster alone; its children exit when they find it gone.
  }
  for (const pid of [postmaster, ...children]) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }
}

function exited(proc: ChildProcess, timeoutMs: number): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      killQuietly(proc, 'SIGKILL');
      resolve();
    }, timeoutMs);
    proc.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}
