import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadAgentConfig } from '@hangar/agent/config';
import { describe, expect, it } from 'vitest';
import YAML from 'yaml';
import { loadConfig } from '../src/config.js';
import { schema as serverSettings } from '../src/config-schema.js';

// deploy/kubernetes as a cluster would get it, without a cluster (none is reachable here or in CI): each
// kustomization rendered (the subset of kustomize they use, below; checked against `kubectl kustomize` where this
// machine has kubectl), every object validated against the Kubernetes API's schemas (kubernetes-models, generated
// from them), and the environment each container gets fed to the server's and the agent's own config readers: a
// variable neither reads (a misspelling) fails, and so does a value they refuse.

const repo = fileURLToPath(new URL('../..', import.meta.url));
const root = path.join(repo, 'deploy/kubernetes');
const KUSTOMIZATIONS = ['base', 'overlays/production'];

type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; [k: string]: unknown };
type Container = {
  name: string;
  image?: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string; valueFrom?: Record<string, { name?: string; key?: string }> }[];
  envFrom?: { configMapRef?: { name: string }; secretRef?: { name: string } }[];
  lifecycle?: { preStop?: { exec?: { command: string[] } } };
  readinessProbe?: { httpGet?: { path: string } };
  livenessProbe?: { httpGet?: { path: string } };
  resources?: { limits?: Record<string, unknown> };
  volumeMounts?: { name: string; mountPath: string }[];
};
type PodSpec = {
  containers: Container[];
  terminationGracePeriodSeconds?: number;
  nodeSelector?: Record<string, string>;
  tolerations?: { key?: string }[];
  volumes?: { name: string; secret?: { secretName: string } }[];
};

const docs = (file: string) =>
  YAML.parseAllDocuments(readFileSync(file, 'utf8'))
    .map((d) => d.toJS() as Obj | null)
    .filter((o): o is Obj => o !== null);

const isPlain = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Where strategic merge patching merges list items instead of replacing the list: the field naming an item. */
const MERGE_KEY: Record<string, string> = {
  containers: 'name',
  initContainers: 'name',
  env: 'name',
  volumes: 'name',
  ports: 'containerPort',
  volumeMounts: 'mountPath',
};

/** Kubernetes' strategic merge patch, for maps and the keyed lists above (what the overlays patch). */
function strategicMerge(base: unknown, patch: unknown, field = ''): unknown {
  if (isPlain(base) && isPlain(patch)) {
    const out: Record<string, unknown> = { ...base };
    for (const [k, v] of Object.entries(patch)) out[k] = k in base ? strategicMerge(base[k], v, k) : v;
    return out;
  }
  const key = MERGE_KEY[field];
  if (key && Array.isArray(base) && Array.isArray(patch)) {
    // Items the base lacks come first, as kustomize puts them (it matters to $(NAME) in a later env value).
    const out = [...base];
    const added: unknown[] = [];
    for (const item of patch as Record<string, unknown>[]) {
      const at = out.findIndex((b) => isPlain(b) && b[key] === item[key]);
      if (at >= 0) out[at] = strategicMerge(out[at], item);
      else added.push(item);
    }
    return [...added, ...out];
  }
  return patch;
}

/** Every container of every pod template in `obj`. */
const podSpecOf = (o: Obj) => (o.spec as { template?: { spec: PodSpec } } | undefined)?.template?.spec;

/** A kustomization's objects, rendered as kustomize does for the fields these use; anything else fails loudly. */
function render(dir: string): Obj[] {
  const k = YAML.parse(readFileSync(path.join(dir, 'kustomization.yaml'), 'utf8')) as Record<string, unknown>;
  const known = ['apiVersion', 'kind', 'namespace', 'resources', 'patches', 'images'];
  expect(
    Object.keys(k).filter((f) => !known.includes(f)),
    `${dir}: a kustomize field this test cannot render`,
  ).toEqual([]);
  let objs: Obj[] = [];
  for (const r of (k.resources as string[]) ?? []) {
    const at = path.join(dir, r);
    objs.push(...(existsSync(path.join(at, 'kustomization.yaml')) ? render(at) : docs(at)));
  }
  for (const p of (k.patches as { path: string }[]) ?? []) {
    for (const patch of docs(path.join(dir, p.path))) {
      const at = objs.findIndex((o) => o.kind === patch.kind && o.metadata.name === patch.metadata.name);
      expect(at, `${dir}/${p.path}: patches ${patch.kind} ${patch.metadata.name}, which is not there`).toBeGreaterThan(
        -1,
      );
      objs[at] = strategicMerge(objs[at], patch) as Obj;
    }
  }
  if (typeof k.namespace === 'string') {
    const ns = k.namespace;
    objs = objs.map((o) => (o.kind === 'Namespace' ? o : { ...o, metadata: { ...o.metadata, namespace: ns } }));
  }
  for (const image of (k.images as { name: string; newName?: string; newTag?: string }[]) ?? []) {
    for (const o of objs) {
      const spec = podSpecOf(o) as (PodSpec & { initContainers?: Container[] }) | undefined;
      for (const c of [...(spec?.containers ?? []), ...(spec?.initContainers ?? [])]) {
        const [name, tag] = (c.image ?? '').split(':');
        if (name !== image.name) continue;
        c.image = `${image.newName ?? name}:${image.newTag ?? tag ?? 'latest'}`;
      }
    }
  }
  return objs;
}

/** The kubernetes-models class for an object's apiVersion and kind (kubernetes-models/apps/v1/Deployment). */
async function modelFor(o: Obj) {
  const mod = (await import(`kubernetes-models/${o.apiVersion}/${o.kind}`)) as Record<
    string,
    new (
      data: unknown,
    ) => { validate(): void }
  >;
  const Model = mod[o.kind];
  if (!Model) throw new Error(`kubernetes-models has no ${o.apiVersion} ${o.kind}`);
  return Model;
}

const SECRET_PLACEHOLDERS: Record<string, string> = {
  DATABASE_URL: 'postgresql://hangar:secret@db:5432/hangar',
  HANGAR_ADMIN_EMAIL: 'admin@example.com',
  HANGAR_ADMIN_PASSWORD: 'twelve-or-more-characters',
};

/** The names and values a container's process gets: its ConfigMaps' data, then its own env (which wins). */
function environment(c: Container, objs: Obj[]) {
  const env = new Map<string, string>();
  for (const from of c.envFrom ?? []) {
    expect(from.secretRef, 'a whole Secret as env hides which names it sets: name each one').toBeUndefined();
    const map = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === from.configMapRef?.name);
    expect(map, `${c.name}: ConfigMap ${from.configMapRef?.name} is not among the manifests`).toBeTruthy();
    for (const [k, v] of Object.entries((map as { data?: Record<string, string> }).data ?? {})) env.set(k, v);
  }
  for (const e of c.env ?? []) {
    // A secret's value is not in the manifests: a placeholder of the shape the reader expects stands for it.
    const value = e.value ?? (e.valueFrom?.fieldRef ? '10.0.0.7' : (SECRET_PLACEHOLDERS[e.name] ?? 'secret'));
    env.set(
      e.name,
      value.replace(/\$\(([A-Z_]+)\)/g, (_, n: string) => env.get(n) ?? ''),
    );
  }
  return env;
}

/** Names a container sets that its program does not read, and that its own command and other values do not use. */
function unread(c: Container, env: Map<string, string>, reads: (name: string) => boolean) {
  const script = [...(c.command ?? []), ...(c.args ?? [])].join(' ');
  // Names the command sets for the program itself (NAME="…" exec …) count as set.
  const set = [...env.keys(), ...[...script.matchAll(/\b([A-Z][A-Z0-9_]*)=/g)].map((m) => m[1] as string)];
  const usedHere = (n: string) =>
    new RegExp(`\\$\\{?${n}\\b|\\$\\(${n}\\)`).test(script) || (c.env ?? []).some((e) => e.value?.includes(`$(${n})`));
  return set.filter((n) => !reads(n) && !usedHere(n));
}

// The AWS SDK reads these itself (credentials, region, endpoint): the S3 mirror store is built on it.
const AWS_SDK = ['AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'AWS_SESSION_TOKEN', 'AWS_REGION', 'AWS_ENDPOINT_URL'];
const serverReads = (n: string) => n in serverSettings.shape || AWS_SDK.includes(n);
const agentSource = readFileSync(path.join(repo, 'packages/agent/src/config.ts'), 'utf8');
const agentReads = (n: string) => new RegExp(`^  ${n}: `, 'm').test(agentSource);

const rendered = Object.fromEntries(KUSTOMIZATIONS.map((k) => [k, render(path.join(root, k))]));
const find = (objs: Obj[], kind: string, name: string) => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  expect(o, `no ${kind} ${name}`).toBeTruthy();
  return o as Obj;
};

describe.each(KUSTOMIZATIONS)('deploy/kubernetes/%s', (which) => {
  const objs = rendered[which] as Obj[];

  it('renders as kubectl kustomize does, and every object is valid against the Kubernetes schemas', async () => {
    // The renderer above is checked against the real kustomize where kubectl is installed (a developer's machine);
    // the schema validation below needs neither.
    const kubectl = process.env.PATH?.split(path.delimiter).some((d) => existsSync(path.join(d, 'kubectl')));
    if (kubectl) {
      const real = YAML.parseAllDocuments(
        execFileSync('kubectl', ['kustomize', path.join(root, which)], { encoding: 'utf8' }),
      )
        .map((d) => d.toJS() as Obj)
        .sort((a, b) => `${a.kind}/${a.metadata.name}`.localeCompare(`${b.kind}/${b.metadata.name}`));
      const ours = [...objs].sort((a, b) =>
        `${a.kind}/${a.metadata.name}`.localeCompare(`${b.kind}/${b.metadata.name}`),
      );
      expect(ours).toEqual(real);
    }
    expect(objs.length).toBeGreaterThan(5);
    for (const o of objs) {
      const Model = await modelFor(o);
      expect(() => new Model(o).validate(), `${which}: ${o.kind} ${o.metadata.name}`).not.toThrow();
    }
  });

  it("sets only variables the server's and the agent's config read, with values they accept", () => {
    const server = (find(objs, 'Deployment', 'hangar').spec as { template: { spec: PodSpec } }).template.spec;
    const hangar = server.containers.find((c) => c.name === 'hangar') as Container;
    const serverEnv = environment(hangar, objs);
    expect(unread(hangar, serverEnv, serverReads)).toEqual([]);
    // The server's own reader takes them all: it throws, naming each value it refuses.
    const config = loadConfig(Object.fromEntries(serverEnv));
    expect(config.host).toBe('0.0.0.0');
    // Three replicas must share one database: the embedded one is one process's own.
    expect(config.databaseUrl).toMatch(/^postgresql:/);

    const agentSpec = (find(objs, 'DaemonSet', 'hangar-agent').spec as { template: { spec: PodSpec } }).template.spec;
    const agent = agentSpec.containers.find((c) => c.name === 'agent') as Container;
    const agentEnv = environment(agent, objs);
    expect(unread(agent, agentEnv, agentReads)).toEqual([]);
    // The token the command reads from the Secret stands in here.
    const agentConfig = loadAgentConfig({ ...Object.fromEntries(agentEnv), HANGAR_NODE_TOKEN: 'hgn_placeholder' });
    expect(agentConfig.url).toBe('http://hangar.hangar.svc:4000');
    expect(agentConfig.advertiseUrl).toBe('http://10.0.0.7:8080/v1');
  });

  it('runs three replicas that leave the Service when not ready, stop within the grace period, and keep two through a drain', () => {
    const deployment = find(objs, 'Deployment', 'hangar') as Obj & {
      spec: { replicas: number; template: { metadata: { labels: Record<string, string> }; spec: PodSpec } };
    };
    expect(deployment.spec.replicas).toBe(3);
    const pod = deployment.spec.template.spec;
    const hangar = pod.containers[0] as Container;
    expect(hangar.readinessProbe?.httpGet?.path).toBe('/readyz');
    expect(hangar.livenessProbe?.httpGet?.path).toBe('/healthz');
    // preStop's wait, then the server's grace for open requests, then its own stopping (jobs, downloads back in
    // the queue, usage settled; a few seconds) must end before the kubelet's SIGKILL.
    const preStop = Number(hangar.lifecycle?.preStop?.exec?.command.at(-1) ?? 0);
    const graceMs = loadConfig(Object.fromEntries(environment(hangar, objs))).shutdownGraceMs;
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThanOrEqual(preStop + graceMs / 1000 + 10);

    const labels = deployment.spec.template.metadata.labels;
    const selects = (o: Obj, at: (o: Obj) => Record<string, string> | undefined) =>
      Object.entries(at(o) ?? {}).every(([k, v]) => labels[k] === v);
    const pdb = find(objs, 'PodDisruptionBudget', 'hangar');
    expect(
      selects(pdb, (o) => (o.spec as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels),
    ).toBe(true);
    expect((pdb.spec as { minAvailable: number }).minAvailable).toBeLessThan(deployment.spec.replicas);
    const service = find(objs, 'Service', 'hangar');
    expect(selects(service, (o) => (o.spec as { selector: Record<string, string> }).selector)).toBe(true);
  });

  it('runs the agent on GPU nodes only, with a GPU, and its own node token from a Secret', () => {
    const daemonSet = find(objs, 'DaemonSet', 'hangar-agent');
    const pod = (daemonSet.spec as { template: { spec: PodSpec } }).template.spec;
    const agent = pod.containers[0] as Container;
    expect(agent.resources?.limits?.['nvidia.com/gpu']).toBeGreaterThan(0);
    expect(Object.keys(pod.nodeSelector ?? {})).toContain('nvidia.com/gpu.present');
    expect(pod.tolerations?.map((t) => t.key)).toContain('nvidia.com/gpu');
    const tokens = pod.volumes?.find((v) => v.secret);
    expect(tokens?.secret?.secretName).toBe('hangar-node-tokens');
    const mount = agent.volumeMounts?.find((m) => m.name === tokens?.name)?.mountPath;
    expect(agent.command?.join(' ')).toContain(`HANGAR_NODE_TOKEN="$(cat "${mount}/$NODE_NAME")"`);
  });
});

it('production keeps the weights in S3, with the credentials from a Secret', () => {
  const objs = rendered['overlays/production'] as Obj[];
  const pod = (find(objs, 'Deployment', 'hangar').spec as { template: { spec: PodSpec } }).template.spec;
  const hangar = pod.containers[0] as Container;
  const env = environment(hangar, objs);
  expect(env.get('HANGAR_MIRROR_STORE')).toMatch(/^s3:\/\/[a-z0-9.-]+\//);
  for (const name of ['AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY']) {
    expect(hangar.env?.find((e) => e.name === name)?.valueFrom?.secretKeyRef?.name).toBe('hangar-s3');
  }
  // Every image from the site's registry.
  const images = objs.flatMap((o) => {
    const spec = podSpecOf(o) as (PodSpec & { initContainers?: Container[] }) | undefined;
    return [...(spec?.containers ?? []), ...(spec?.initContainers ?? [])].map((c) => c.image);
  });
  expect(images.length).toBeGreaterThan(2);
  for (const image of images) expect(image).toMatch(/^registry\.example\.com\//);
});

it('has a kustomization in every folder it ships', () => {
  const dirs = ['base', ...readdirSync(path.join(root, 'overlays')).map((d) => `overlays/${d}`)];
  expect(dirs.sort()).toEqual([...KUSTOMIZATIONS].sort());
});
