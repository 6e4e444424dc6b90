import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { recordSql } from '../../test/sql-count.js';

// The Mirror page's query: how many SQL statements it costs, whatever the version count, and that every row
// still names the catalog models and adapters that use it.

let t: TestApp;
let token: string;
let base: string;
beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  token = await t.token('OPERATOR', 'mirror-listing');
});
afterAll(() => t.close());

const PAGE = `{ mirror { families { name versions { id usedBy { name mode replicas maxReplicas declared adapterOf } } } } }`;

async function addVersions(from: number, to: number) {
  await t.app.db.prisma.mirrorFile.createMany({
    data: Array.from({ length: to - from }, (_, k) => ({
      model: `listed-${from + k}`,
      version: 'v1',
      file: 'model.gguf',
      sourceUrl: `https://hub.example/listed-${from + k}/model.gguf`,
      state: 'PRESENT' as const,
      bytesDone: 10n,
      bytesTotal: 10n,
    })),
  });
}

type Row = { id: string; usedBy: { name: string; mode: string; replicas: number; adapterOf: string | null }[] };
async function page() {
  const r = await t.gql<{ mirror: { families: { versions: Row[] }[] } }>(PAGE, {}, { token });
  expect(r.errors).toBeUndefined();
  return new Map((r.data?.mirror.families.flatMap((f) => f.versions) ?? []).map((v) => [v.id, v.usedBy] as const));
}

describe("the Mirror page's query", () => {
  it('names the models and adapters using each version', async () => {
    await addVersions(0, 3);
    const model = await t.app.db.prisma.catalogModel.create({
      data: { name: 'listed-model', source: `${base}/mirror/listed-0/v1/model.gguf`, engine: 'llamacpp' },
    });
    await t.app.db.prisma.catalogModel.create({
      data: {
        name: 'listed-stopped',
        source: `${base}/mirror/listed-1/v1/model.gguf`,
        engine: 'llamacpp',
        minReplicas: 0,
        maxReplicas: 0,
      },
    });
    // On demand: none running while idle, up to 3 when asked; the row says 3, not 0.
    await t.app.db.prisma.catalogModel.create({
      data: {
        name: 'listed-on-demand',
        source: `${base}/mirror/listed-1/v1/model.gguf`,
        engine: 'llamacpp',
        minReplicas: 0,
        maxReplicas: 3,
      },
    });
    await t.app.db.prisma.adapter.create({
      data: { name: 'listed-lora', source: `${base}/mirror/listed-0/v1/lora.gguf`, modelId: model.id },
    });
    await t.app.db.prisma.adapter.create({
      data: { name: 'listed-peft', source: `${base}/mirror/listed-2/v1/`, modelId: model.id },
    });
    const rows = await page();
    expect(rows.get('listed-0/v1')).toEqual([
      { name: 'listed-model', mode: 'ALWAYS', replicas: 1, maxReplicas: 1, declared: false, adapterOf: null },
      { name: 'listed-lora', mode: 'ALWAYS', replicas: 1, maxReplicas: 1, declared: false, adapterOf: 'listed-model' },
    ]);
    expect(rows.get('listed-1/v1')).toEqual(
      expect.arrayContaining([
        { name: 'listed-stopped', mode: 'STOPPED', replicas: 0, maxReplicas: 0, declared: false, adapterOf: null },
        { name: 'listed-on-demand', mode: 'ON_DEMAND', replicas: 0, maxReplicas: 3, declared: false, adapterOf: null },
      ]),
    );
    expect(rows.get('listed-1/v1')).toHaveLength(2);
    expect(rows.get('listed-2/v1')).toEqual([
      { name: 'listed-peft', mode: 'ALWAYS', replicas: 1, maxReplicas: 1, declared: false, adapterOf: 'listed-model' },
    ]);
    // One version asked alone answers the same.
    const one = await t.gql(
      '{ mirrorVersion(model: "listed-0", version: "v1") { usedBy { name adapterOf } } }',
      {},
      { token },
    );
    expect(one.data?.mirrorVersion.usedBy).toEqual([
      { name: 'listed-model', adapterOf: null },
      { name: 'listed-lora', adapterOf: 'listed-model' },
    ]);
  });

  it('takes the same SQL statements at 3 versions and at 30', async () => {
    await page(); // the token's first lookup, outside the count
    await t.app.db.prisma.mirrorFile.updateMany({ where: { model: 'listed-0' }, data: { attempts: 1 } });
    const at3 = await recordSql(page);
    expect(at3.result.size).toBe(3);
    await addVersions(3, 30);
    const at30 = await recordSql(page);
    expect(at30.result.size).toBe(30);
    // The same statements; only the list of rows that changed is longer.
    const shape = (q: string) => q.replace(/IN \([$\d,]+\) OFFSET \$\d+/, 'IN (…) OFFSET …');
    expect(at30.statements.map(shape)).toEqual(at3.statements.map(shape));
    // The rows' versions, the rows that changed, the free space the running downloads promise, the catalog's
    // models and adapters, and which versions have an owner (an operator is not an admin: it sees only those
    // whose owner admits it).
    expect(at30.statements).toHaveLength(5);
  });

  // The listing keeps the rows it read with their xmin, and reads again only those whose xmin moved: a change
  // made by any statement (here one the server never hears of) shows at the next read.
  it('reads again only the rows that changed, whoever changed them', async () => {
    await page();
    const unchanged = await recordSql(page);
    expect(unchanged.statements.filter((q) => /FROM "public"."MirrorFile"/.test(q))).toEqual([]);
    expect(unchanged.statements).toHaveLength(4);

    await t.app.db.prisma
      .$executeRaw`UPDATE "MirrorFile" SET "bytesDone" = 7, state = 'FETCHING' WHERE model = 'listed-5'`;
    const versions = async () =>
      (await t.gql('{ mirror { versions { id state bytesDone } } }', {}, { token })).data?.mirror.versions as {
        id: string;
        state: string;
        bytesDone: number;
      }[];
    const after = await recordSql(versions);
    expect(after.result.find((v) => v.id === 'listed-5/v1')).toEqual({
      id: 'listed-5/v1',
      state: 'FETCHING',
      bytesDone: 7,
    });
    const reads = after.statements.filter((q) => /FROM "public"."MirrorFile"/.test(q));
    expect(reads).toHaveLength(1);
    expect(reads[0]).toMatch(/IN \(\$1\)/); // one row asked for

    await t.app.db.prisma.$executeRaw`DELETE FROM "MirrorFile" WHERE model = 'listed-6'`;
    expect((await versions()).some((v) => v.id === 'listed-6/v1')).toBe(false);
  });

  it('refuses to remove a version only an adapter uses, unless forced', async () => {
    const r = await t.gql(
      'mutation { removeMirrorVersion(model: "listed-2", version: "v1") { __typename ... on Error { message } } }',
      {},
      { token },
    );
    expect(r.data?.removeMirrorVersion).toMatchObject({
      __typename: 'ConflictError',
      message: expect.stringMatching(/is the source of listed-peft \(an adapter of listed-model\)/),
    });
  });
});
