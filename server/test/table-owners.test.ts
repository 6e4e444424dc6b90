import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { TABLE_OWNERS } from '../src/db/owners.js';
import type { Crossing } from './table-owners-scan.js';
import { compare, crossings, key, scanSource } from './table-owners-scan.js';

// Each table has one owning domain (src/db/owners.ts). A domain that reads or writes another's table through a
// Prisma delegate or raw SQL couples the two schemas: this finds every such crossing. The ones that exist today
// are listed in ALLOWED with why; a new one fails, and so does a listed one that is gone (remove it: the list
// only shrinks as the seams close).

const here = path.dirname(fileURLToPath(import.meta.url));
const src = path.join(here, '../src');
const schema = path.join(here, '../../prisma/schema.prisma');
const doc = path.join(here, '../../docs/architecture.md');

/** The crossings that exist today: file (under server/src), table, read|write, and why it is still there. */
const ALLOWED: (Crossing & { why: string })[] = [
  {
    file: 'access/access.service.ts',
    table: 'Session',
    kind: 'write',
    why: 'a disabled user or changed password ends their sessions in the same transaction; next step: auth.endSessions(tx, userId)',
  },
  {
    file: 'audit/owned-target.ts',
    table: 'Adapter',
    kind: 'read',
    why: "an audit event's target is tagged with its owner; next step: catalog answers ownerOf(name)",
  },
  {
    file: 'audit/owned-target.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "as above, for a model's owner; next step: catalog answers ownerOf(name)",
  },
  {
    file: 'audit/owned-target.ts',
    table: 'TrainJob',
    kind: 'read',
    why: "as above, for a job's owner; next step: train answers ownerOf(id)",
  },
  {
    file: 'auth/auth.schema.ts',
    table: 'User',
    kind: 'read',
    why: 'the viewer resolver loads its user row; next step: access.user(id)',
  },
  {
    file: 'auth/auth.service.ts',
    table: 'ApiToken',
    kind: 'read',
    why: 'a bearer secret is looked up by hash; next step: access.tokenByHash',
  },
  {
    file: 'auth/auth.service.ts',
    table: 'ApiToken',
    kind: 'write',
    why: 'lastUsedAt is stamped on use; next step: access.touchToken',
  },
  {
    file: 'auth/auth.service.ts',
    table: 'Node',
    kind: 'read',
    why: "a node's secret signs in its agent; next step: fleet.nodeByTokenHash",
  },
  {
    file: 'auth/auth.service.ts',
    table: 'User',
    kind: 'read',
    why: 'sign-in finds the user by email; next step: access.userByEmail',
  },
  {
    file: 'auth/auth.service.ts',
    table: 'User',
    kind: 'write',
    why: 'a password change and the first admin are written here; next step: access.setPassword / createFirstAdmin',
  },
  {
    file: 'catalog/catalog.service.ts',
    table: 'Replica',
    kind: 'read',
    why: 'switching a model to ON_DEMAND counts its running replicas; next step: fleet.runningReplicas(modelId)',
  },
  {
    file: 'fleet/fleet-placement.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "placement reads every model's wanted replicas under its lock; next step: a catalog snapshot",
  },
  {
    file: 'fleet/fleet-replicas.ts',
    table: 'CatalogModel',
    kind: 'write',
    why: 'a measured model size is written back on the model; next step: catalog.recordMeasuredSize',
  },
  {
    file: 'fleet/fleet.service.ts',
    table: 'TrainJob',
    kind: 'read',
    why: 'placement keeps GPUs that running training jobs hold; next step: train.gpusHeld()',
  },
  {
    file: 'gateway/routes.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: 'seam left: the route table reads catalog rows (with replicas, nodes, keys); next step: a snapshot from catalog',
  },
  {
    file: 'gateway/usage.service.ts',
    table: 'Adapter',
    kind: 'read',
    why: "usage rows of another owner's adapters are hidden in SQL; next step: an owner filter from catalog",
  },
  {
    file: 'gateway/usage.service.ts',
    table: 'ApiToken',
    kind: 'read',
    why: "usage is filtered to the viewer's tokens in SQL; next step: token ids from access",
  },
  {
    file: 'gateway/usage.service.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "usage rows of another owner's models are hidden in SQL; next step: an owner filter from catalog",
  },
  {
    file: 'hf/hf.service.ts',
    table: 'MirrorFile',
    kind: 'read',
    why: "the Hub API's snapshot lists mirrored files; next step: mirror.filesOf(repo, revision)",
  },
  {
    file: 'hf/pull-through.ts',
    table: 'MirrorFile',
    kind: 'read',
    why: "pull-through polls a file's download progress; next step: mirror.waitForFile",
  },
  {
    file: 'metrics/metrics.ts',
    table: 'MirrorFile',
    kind: 'read',
    why: 'metrics gauges count rows of every domain; next step: each domain publishes its gauges',
  },
  { file: 'metrics/metrics.ts', table: 'Node', kind: 'read', why: 'metrics gauges (as above)' },
  { file: 'metrics/metrics.ts', table: 'Replica', kind: 'read', why: 'metrics gauges (as above)' },
  { file: 'metrics/metrics.ts', table: 'TrainJob', kind: 'read', why: 'metrics gauges (as above)' },
  { file: 'metrics/metrics.ts', table: 'TrainMetric', kind: 'read', why: 'metrics gauges (as above)' },
  {
    file: 'mirror/mirror-reads.ts',
    table: 'Adapter',
    kind: 'read',
    why: "which models and adapters use a mirrored version, in one SQL join; next step: catalog.sourcesUnder('/mirror/')",
  },
  { file: 'mirror/mirror-reads.ts', table: 'CatalogModel', kind: 'read', why: 'as above' },
  {
    file: 'mirror/owned.ts',
    table: 'Adapter',
    kind: 'read',
    why: "a mirrored version's owner is its adapter's; next step: catalog.ownerOfSource",
  },
  {
    file: 'mirror/owned.ts',
    table: 'TrainJob',
    kind: 'read',
    why: "a training output's owner is its job's; next step: train.ownerOf",
  },
  {
    file: 'mirror/serve.ts',
    table: 'Replica',
    kind: 'read',
    why: 'a node may read a version only if it runs a replica of its model; next step: fleet.runsModel(node, model)',
  },
  {
    file: 'org/org-lookup.ts',
    table: 'ApiToken',
    kind: 'read',
    why: 'a member named by token id; next step: access.token(id)',
  },
  {
    file: 'org/org-lookup.ts',
    table: 'User',
    kind: 'read',
    why: 'a member named by email or id; next step: access.user',
  },
  {
    file: 'org/org-owners.ts',
    table: 'ApiToken',
    kind: 'read',
    why: 'owner keys are resolved to names; next step: access names tokens',
  },
  {
    file: 'org/org-owners.ts',
    table: 'User',
    kind: 'read',
    why: 'owner keys are resolved to names; next step: access names users',
  },
  {
    file: 'org/org.service.ts',
    table: 'Adapter',
    kind: 'read',
    why: 'deleting an owner lists what it still holds; next step: catalog.heldBy(keys)',
  },
  { file: 'org/org.service.ts', table: 'CatalogModel', kind: 'read', why: 'as above' },
  { file: 'org/org.service.ts', table: 'TrainJob', kind: 'read', why: 'as above; next step: train.heldBy(keys)' },
  {
    file: 'serve/serve-job-steps.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "a serve job polls the model's replicas until ready; next step: catalog/fleet events",
  },
  {
    file: 'train/artifacts.ts',
    table: 'Adapter',
    kind: 'write',
    why: 'a finished job registers its adapter; next step: catalog.addAdapter',
  },
  {
    file: 'train/artifacts.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: 'the base model and its adapters, for registering; next step: catalog.model(name)',
  },
  {
    file: 'train/artifacts.ts',
    table: 'MirrorFile',
    kind: 'read',
    why: "the base model's mirrored file; next step: mirror.file",
  },
  {
    file: 'train/base-files.ts',
    table: 'MirrorFile',
    kind: 'read',
    why: "a job's base weights listed from the mirror; next step: mirror.filesOf",
  },
  {
    file: 'train/model-file.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "a job's base model resolved by name; next step: catalog.model(name)",
  },
  { file: 'train/model-file.ts', table: 'MirrorFile', kind: 'read', why: 'its mirrored file; next step: mirror.file' },
  {
    file: 'train/train-node.ts',
    table: 'Node',
    kind: 'read',
    why: "a node's free GPUs decide its work; next step: fleet.node(id)",
  },
  {
    file: 'train/train.service.ts',
    table: 'Adapter',
    kind: 'read',
    why: "a new job's adapter name must be free; next step: catalog.nameTaken",
  },
  {
    file: 'train/train.service.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "a new job's base model and name clash; next step: catalog.model / nameTaken",
  },
  {
    file: 'train/train.service.ts',
    table: 'Node',
    kind: 'read',
    why: "a new job's node by name; next step: fleet.nodeByName",
  },
  {
    file: 'train/train.types.ts',
    table: 'Adapter',
    kind: 'read',
    why: "a job's adapter name in GraphQL; next step: a catalog loader",
  },
  {
    file: 'train/train.types.ts',
    table: 'User',
    kind: 'read',
    why: "a job's creator's email in GraphQL; next step: an access loader",
  },
];

function schemaModels(): string[] {
  return [...fs.readFileSync(schema, 'utf8').matchAll(/^model\s+(\w+)\s*\{/gm)].map((m) => m[1] ?? '');
}

describe('table owners', () => {
  it('gives every Prisma model one owner, and no owner to a model that is gone', () => {
    expect(Object.keys(TABLE_OWNERS).sort()).toEqual(schemaModels().sort());
  });

  it('is the map docs/architecture.md shows', () => {
    const text = fs.readFileSync(doc, 'utf8');
    const section = text.split('## Who owns which table')[1]?.split('\n## ')[0] ?? '';
    const pairs = new Map<string, string>();
    for (const [, domain = '', tables = ''] of section.matchAll(/^\|\s*`?(\w+)`?\s*\|\s*(.+?)\s*\|\s*$/gm)) {
      for (const table of tables.split(',').map((s) => s.trim().replace(/`/g, ''))) {
        if (table && domain !== 'Domain') pairs.set(table, domain);
      }
    }
    expect(Object.fromEntries([...pairs].sort())).toEqual(Object.fromEntries(Object.entries(TABLE_OWNERS).sort()));
  });

  it('finds no crossing beyond the allowed ones, and no allowed one that is gone', () => {
    expect(compare(crossings(src, TABLE_OWNERS), ALLOWED)).toEqual({ new: [], stale: [] });
    expect(ALLOWED.length).toBe(new Set(ALLOWED.map(key)).size);
  });
});

describe('scanSource', () => {
  const models = ['MirrorFile', 'CatalogModel', 'TrainJob', 'UsageMinute'];

  it('finds Prisma delegates, reads and writes, across line breaks and type arguments', () => {
    const src = [
      'const a = await tx.mirrorFile.findMany({});',
      'await this.db.catalogModel',
      '  .update({ where });',
      'await db.loops.trainJob.groupBy({ by: ["state"] });',
      'const n = o.mirrorFile.length; // not a delegate call',
    ].join('\n');
    expect(scanSource(src, models).map((a) => [a.table, a.kind, a.line])).toEqual([
      ['MirrorFile', 'read', 1],
      ['CatalogModel', 'write', 2],
      ['TrainJob', 'read', 4],
    ]);
  });

  it('finds tables in raw SQL, a write after INSERT INTO / UPDATE / DELETE FROM', () => {
    const src = [
      'const rows = await db.$queryRaw`SELECT owner FROM "TrainJob" t JOIN "CatalogModel" m ON m.id = t.x`;',
      'const UPSERT = `INSERT INTO "UsageMinute" (a) VALUES ($1) ON CONFLICT DO UPDATE SET a = "UsageMinute".a + 1`;',
      'await tx.$executeRawUnsafe(`update "MirrorFile" SET x = 1`);',
      '// a comment about "CatalogModel" is prose',
      "const o = { 'CatalogModel': 1 };",
    ].join('\n');
    expect(scanSource(src, models).map((a) => [a.table, a.kind, a.line])).toEqual([
      ['TrainJob', 'read', 1],
      ['CatalogModel', 'read', 1],
      ['UsageMinute', 'write', 2],
      ['UsageMinute', 'read', 2],
      ['MirrorFile', 'write', 3],
    ]);
  });

  it('fails on a new crossing: a scratch tree with one domain reaching into another', () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'table-owners-'));
    try {
      fs.mkdirSync(path.join(root, 'mirror'));
      fs.mkdirSync(path.join(root, 'generated'));
      fs.writeFileSync(path.join(root, 'mirror/own.ts'), 'await db.mirrorFile.update({});');
      fs.writeFileSync(path.join(root, 'mirror/own.test.ts'), 'await db.trainJob.update({});');
      fs.writeFileSync(path.join(root, 'generated/x.ts'), 'await db.trainJob.update({});');
      fs.writeFileSync(path.join(root, 'mirror/reach.ts'), 'x;\nawait db.$queryRaw`SELECT 1 FROM "TrainJob"`;');
      const found = crossings(root, { MirrorFile: 'mirror', TrainJob: 'train' });
      expect(found.map((c) => `${key(c)} ${c.line}`)).toEqual(['mirror/reach.ts TrainJob read 2']);
      // Unlisted, it fails as new; listed, it passes; a listed crossing that is gone fails as stale.
      const reach = { file: 'mirror/reach.ts', table: 'TrainJob', kind: 'read' } as const;
      const gone = { file: 'mirror/gone.ts', table: 'TrainJob', kind: 'write' } as const;
      expect(compare(found, [])).toEqual({ new: ['mirror/reach.ts TrainJob read (line 2)'], stale: [] });
      expect(compare(found, [reach])).toEqual({ new: [], stale: [] });
      expect(compare(found, [reach, gone])).toEqual({ new: [], stale: ['mirror/gone.ts TrainJob write'] });
    } finally {
      fs.rmSync(root, { recursive: true, force: true });
    }
  });
});
