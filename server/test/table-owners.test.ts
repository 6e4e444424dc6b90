import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { TABLE_OWNERS } from '../src/db/owners.js';
import type { Crossing } from './table-owners-scan.js';
import { compare, crossings, key, relationsOf, scanSource } from './table-owners-scan.js';

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
  // GraphQL edges (the scanner sees Pothos's t.relation and field-level select): reads only, batched by Pothos.
  {
    file: 'access/access.schema.ts',
    table: 'Membership',
    kind: 'read',
    why: "an API token's memberOf names where it is a member (Pothos select through memberships to org, team, project); next step: org answers memberships of a key, batched",
  },
  {
    file: 'access/access.schema.ts',
    table: 'Org',
    kind: 'read',
    why: 'as above',
  },
  {
    file: 'access/access.schema.ts',
    table: 'Team',
    kind: 'read',
    why: 'as above',
  },
  {
    file: 'access/access.schema.ts',
    table: 'Project',
    kind: 'read',
    why: 'as above',
  },
  {
    file: 'fleet/fleet.schema.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "Replica.model, a GraphQL edge between two domains' types: Pothos loads the related row when a query asks for it, batched per request (a resolver calling the owner row by row would be N+1); next step: each owner publishes a loader for its type",
  },
  {
    file: 'org/org.schema.ts',
    table: 'User',
    kind: 'read',
    why: "Membership.user and memberLabel's email, a GraphQL edge between two domains' types: Pothos loads the related row when a query asks for it, batched per request (a resolver calling the owner row by row would be N+1); next step: each owner publishes a loader for its type",
  },
  {
    file: 'org/org.schema.ts',
    table: 'ApiToken',
    kind: 'read',
    why: 'Membership.apiToken, as above',
  },
  {
    file: 'train/train.types.ts',
    table: 'Node',
    kind: 'read',
    why: "TrainJob.node, a GraphQL edge between two domains' types: Pothos loads the related row when a query asks for it, batched per request (a resolver calling the owner row by row would be N+1); next step: each owner publishes a loader for its type",
  },
  // Reads joined to an owned row in one query.
  {
    file: 'auth/auth.service.ts',
    table: 'User',
    kind: 'read',
    why: 'a console session is identified with its user in one read (include), on every request its cache misses: a second round-trip to access would double the cost of identifying a caller',
  },
  {
    file: 'fleet/fleet-replicas.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: "a replica is an instance of its model: a node's assignments and a replica's report read the model row (and its adapters) with the replica, in one read; next step: a catalog snapshot the fleet keeps in memory, as the gateway's route table does",
  },
  {
    file: 'fleet/smoke-tests.ts',
    table: 'CatalogModel',
    kind: 'read',
    why: 'a smoke test asks the replica for its model by name, read with the replica (include); next step: the catalog snapshot above',
  },
  // Not in the lead's brief for this step (hf/ and metrics/ were left to their owners' next pass).
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
    const relations = relationsOf(fs.readFileSync(schema, 'utf8'));
    expect(compare(crossings(src, TABLE_OWNERS, relations), ALLOWED)).toEqual({ new: [], stale: [] });
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

  it('finds the tables a call reads through include and select, at any depth, and in _count', () => {
    const relations = relationsOf(
      [
        'model TrainJob {',
        '  id      String  @id',
        '  model   CatalogModel? @relation(fields: [modelId], references: [id])',
        '  metrics UsageMinute[]',
        '}',
        'model CatalogModel {',
        '  id    String @id',
        '  files MirrorFile[]',
        '  jobs  TrainJob[]',
        '}',
        'model MirrorFile {',
        '  id String @id',
        '}',
        'model UsageMinute {',
        '  id String @id',
        '}',
      ].join('\n'),
    );
    expect(relations.TrainJob).toEqual({ model: 'CatalogModel', metrics: 'UsageMinute' });
    const src = [
      'await db.trainJob.findMany({',
      "  where: { name: 'x, y: { include: { model: true } }' }, // a string and a comment: model: true",
      '  include: {',
      '    model: { select: { name: true, files: { where: { a: 1 } } } },',
      '    _count: { select: { metrics: true } },',
      '  },',
      '});',
      'await db.catalogModel.findUnique({ where: { id }, select: { id: true, jobs: true } });',
      'await db.trainJob.findMany(args); // built elsewhere: not seen',
      'await db.trainJob.findMany({ ...query, where: { id } }); // a spread: not seen',
    ].join('\n');
    const nested = scanSource(src, models, relations).filter((a) => a.via === 'nested');
    expect(nested.map((a) => [a.table, a.kind, a.line])).toEqual([
      ['CatalogModel', 'read', 4],
      ['MirrorFile', 'read', 4],
      ['UsageMinute', 'read', 5],
      ['TrainJob', 'read', 8],
    ]);
  });

  it("finds a Pothos type's relation fields and field-level selects as reads of the related table", () => {
    const relations = { TrainJob: { node: 'Node', model: 'CatalogModel' }, CatalogModel: { jobs: 'TrainJob' } };
    const src = [
      "builder.prismaObject('TrainJob', {",
      '  fields: (t) => ({',
      "    node: t.relation('node', { nullable: true }),",
      '    modelName: t.string({ select: { model: { select: { name: true } } }, resolve: (j) => j.model.name }),',
      '  }),',
      '});',
      "builder.prismaObject('CatalogModel', { fields: (t) => ({ id: t.exposeID('id') }) });",
    ].join('\n');
    expect(scanSource(src, ['TrainJob', 'Node', 'CatalogModel'], relations).map((a) => [a.table, a.line])).toEqual([
      ['Node', 3],
      ['CatalogModel', 4],
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
