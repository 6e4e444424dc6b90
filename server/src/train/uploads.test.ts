import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { Readable } from 'node:stream';
import zlib from 'node:zlib';
import tar from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { BASE_REPO, PAIRS, type TrainingWorld, trainingWorld } from '../../test/fixtures/training.js';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { utf8Fault } from './data.js';

// The uploads a training job is made of, over real HTTP: the pairs (POST /api/train/data) sent many times at
// once, with bytes that are not UTF-8, and refused; and an adapter (PUT …/artifacts/peft) that is a gzip bomb.

const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

describe('utf8Fault', () => {
  it.each([
    ['a lone continuation byte', [0x61, 0x80], { line: 1, byte: 2, offset: 1 }],
    ['an overlong NUL (C0 80)', [0x0a, 0xc0, 0x80], { line: 2, byte: 1, offset: 1 }],
    [
      'a UTF-16 surrogate (ED A0 80)',
      [0x61, 0x0a, 0x62, 0x0a, 0x63, 0xed, 0xa0, 0x80],
      { line: 3, byte: 2, offset: 5 },
    ],
    ['past U+10FFFF (F4 90 80 80)', [0xf4, 0x90, 0x80, 0x80], { line: 1, byte: 1, offset: 0 }],
    ['a sequence cut short at the end', [0x61, 0xe2, 0x82], { line: 1, byte: 2, offset: 1 }],
  ])('finds %s', (_label, bytes, at) => {
    expect(utf8Fault(Uint8Array.from(bytes))).toEqual(at);
  });

  it('agrees with a fatal TextDecoder on random bytes, and finds the first fault', () => {
    const decoder = new TextDecoder('utf-8', { fatal: true });
    for (let i = 0; i < 2000; i++) {
      // Mostly ASCII and valid multi-byte text, with a bad byte now and then.
      const parts = [Buffer.from('é€😀\n', 'utf8'), Buffer.from('plain'), randomBytes(i % 7 === 0 ? 1 : 0)];
      const bytes = Buffer.concat(Array.from({ length: 1 + (i % 5) }, (_, k) => parts[(i + k) % parts.length]!));
      const fault = utf8Fault(bytes);
      let valid = true;
      try {
        decoder.decode(bytes);
      } catch {
        valid = false;
      }
      expect(fault === null, bytes.toString('hex')).toBe(valid);
      if (fault) expect(() => decoder.decode(bytes.subarray(0, fault.offset))).not.toThrow();
    }
  });
});

describe('uploads', () => {
  let t: TestApp;
  let hub: FakeHub;
  let base: string;
  let w: TrainingWorld;

  beforeAll(async () => {
    hub = await startFakeHub();
    t = await startTestApp({ HANGAR_HUB_URL: hub.url });
    base = await t.app.start();
    w = await trainingWorld(t, base, hub);
  }, 120_000);
  afterAll(async () => {
    await t?.close();
    await hub?.close();
  });

  const post = (body: Buffer | string, token = w.operator) =>
    fetch(`${base}/api/train/data`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/x-ndjson' },
      body: typeof body === 'string' ? body : new Uint8Array(body),
    });
  const dataDir = () => path.join(t.dataDir, 'train', 'data');
  const refusals = (action: string) => t.app.db.prisma.auditEvent.count({ where: { action, outcome: 'REFUSED' } });

  it('takes 8 concurrent identical uploads of the pairs, each answered 200 with the same sha256, kept once', async () => {
    const body = `${PAIRS}\n{"q":"concurrent?","a":"yes"}\n`;
    const answers = await Promise.all(Array.from({ length: 8 }, () => post(body)));
    const bodies = await Promise.all(answers.map((r) => r.json() as Promise<{ sha256?: string; error?: string }>));
    expect(
      answers.map((r) => r.status),
      JSON.stringify(bodies),
    ).toEqual(Array(8).fill(200));
    expect(new Set(bodies.map((b) => b.sha256))).toEqual(new Set([sha256(body)]));
    const files = await fs.readdir(dataDir());
    expect(files.filter((f) => f.startsWith(sha256(body)))).toEqual([`${sha256(body)}.ndjson`]);
    expect(files.filter((f) => f.endsWith('.part'))).toEqual([]);
    expect(await fs.readFile(path.join(dataDir(), `${sha256(body)}.ndjson`), 'utf8')).toBe(body);
  });

  it('refuses pairs that are not UTF-8, naming the line and the byte, keeping nothing, and audits it', async () => {
    // Line 3 holds "caf" then Latin-1's é (E9): what a file saved in the wrong encoding looks like.
    const body = Buffer.concat([
      Buffer.from('{"q":"one?","a":"1"}\n{"q":"two?","a":"2"}\n{"q":"caf'),
      Buffer.from([0xe9]),
      Buffer.from('?","a":"coffee"}\n'),
    ]);
    const before = await refusals('uploadTrainData');
    const r = await post(body);
    expect(r.status).toBe(422);
    const { error } = (await r.json()) as { error: string };
    const offset = body.indexOf(0xe9);
    expect(error).toBe(
      `line 3, byte 10 (offset ${offset} in the file) is not UTF-8: the pairs are NDJSON in UTF-8; convert the file ` +
        '(iconv -f <its encoding> -t UTF-8) and upload it again',
    );
    expect(await fs.readdir(dataDir()).catch(() => [])).not.toContain(`${sha256(body)}.ndjson`);
    expect(await refusals('uploadTrainData')).toBe(before + 1);
  });

  it("answers the file's own sha256 for UTF-8 pairs, a byte-order mark and characters past ASCII included", async () => {
    const body = Buffer.concat([
      Buffer.from([0xef, 0xbb, 0xbf]),
      Buffer.from('{"q":"Café? 😀","a":"oui"}\n{"q":"€?","a":"euro"}\n'),
    ]);
    const r = await post(body);
    expect(r.status).toBe(200);
    const report = (await r.json()) as { sha256: string; bytes: number; pairs: number; errorCount: number };
    expect(report).toMatchObject({ sha256: sha256(body), bytes: body.length, pairs: 2, errorCount: 0 });
    expect(sha256(await fs.readFile(path.join(dataDir(), `${sha256(body)}.ndjson`)))).toBe(sha256(body));
  });

  it("takes the console's upload, made with its session cookie and CSRF header", async () => {
    const { cookie, csrf } = await t.login();
    const r = await fetch(`${base}/api/train/data`, {
      method: 'POST',
      headers: { cookie, 'x-hangar-csrf': csrf, 'content-type': 'application/x-ndjson' },
      body: PAIRS,
    });
    expect(r.status, await r.clone().text()).toBe(200);
    expect(((await r.json()) as { sha256: string }).sha256).toBe(sha256(PAIRS));
  });

  it('audits a refused upload of pairs by a viewer', async () => {
    const viewer = await t.token('VIEWER', 'upload-viewer');
    const before = await refusals('uploadTrainData');
    const r = await post(PAIRS, viewer);
    expect(r.status).toBe(403);
    expect(await refusals('uploadTrainData')).toBe(before + 1);
    const row = await t.app.db.prisma.auditEvent.findFirstOrThrow({
      where: { action: 'uploadTrainData' },
      orderBy: { id: 'desc' },
    });
    expect(row).toMatchObject({ outcome: 'REFUSED', actor: expect.stringContaining('upload-viewer') });
  });

  it('refuses an adapter that is a gzip bomb of over 100× (under the 200× once allowed) after holding a sliver of it, naming the limit', async () => {
    const job = (
      await t.gql(
        `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
        {
          i: {
            name: 'bombed',
            model: 'tiny',
            baseRepo: BASE_REPO,
            node: 'gpu-1',
            gpuMiB: 8000,
            public: true,
            data: PAIRS,
          },
        },
        { token: w.operator },
      )
    ).data?.createTrainJob;
    expect(job.__typename).toBe('TrainJob');
    const claim = await t.gql(
      `mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on Error { message } } }`,
      { id: job.id },
      { token: w.nodeToken },
    );
    expect(claim.data?.claimTrainJob.__typename).toBe('TrainClaim');

    // 512 MiB of "weights" that are zeros with a random byte every 1400: gzip makes that about 150× smaller,
    // under the 200× that used to be refused, so the server once filled a 512 MiB buffer with it. Made here, at
    // test time, from one 1 MiB block.
    const declared = 512 * 1024 ** 2;
    const block = Buffer.alloc(1024 ** 2);
    const noise = randomBytes(Math.floor(block.length / 1400));
    for (let i = 0; i < noise.length; i++) block[i * 1400] = noise[i] as number;
    const pack = tar.pack();
    const gz = Readable.from(pack).pipe(zlib.createGzip({ level: 1 }));
    const chunks: Buffer[] = [];
    const made = (async () => {
      for await (const c of gz) chunks.push(c as Buffer);
    })();
    pack.entry({ name: 'adapter_config.json' }, JSON.stringify({ peft_type: 'LORA', r: 4, lora_alpha: 8 }));
    const entry = pack.entry({ name: 'adapter_model.safetensors', size: declared });
    for (let at = 0; at < declared; at += block.length) {
      if (!entry.write(block)) await new Promise((r) => entry.once('drain', r));
    }
    entry.end();
    pack.finalize();
    await made;
    const bomb = Buffer.concat(chunks);
    const ratio = declared / bomb.length;
    expect(ratio).toBeGreaterThan(100);
    expect(ratio).toBeLessThan(200);

    // The server runs in this process: its resident memory is this process's.
    const before = process.memoryUsage().rss;
    let peak = before;
    const sampler = setInterval(() => {
      peak = Math.max(peak, process.memoryUsage().rss);
    }, 2);
    const audits = await refusals('uploadTrainArtifact');
    let status: number;
    let error: string;
    try {
      const r = await fetch(`${base}/api/train/jobs/${job.id}/artifacts/peft`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${w.nodeToken}`, 'content-type': 'application/gzip' },
        body: new Uint8Array(bomb),
      });
      status = r.status;
      error = ((await r.json()) as { error: string }).error;
    } finally {
      clearInterval(sampler);
    }
    peak = Math.max(peak, process.memoryUsage().rss);
    const grewMiB = (peak - before) / 1024 ** 2;
    console.info(
      `gzip bomb over HTTP: ${bomb.length} bytes, ${ratio.toFixed(0)}×, rss +${grewMiB.toFixed(1)} MiB; ${error}`,
    );

    // 422 is the adapter protocol's refusal (docs/training.md): the job fails with the reason, the agent stops.
    expect(status).toBe(422);
    expect(error).toMatch(/^the upload inflates \d+× .* more than 16× \(the limit\) is refused as a gzip bomb/);
    // Held at most 16 bytes per byte read: far under the 512 MiB the bomb declares.
    expect(grewMiB).toBeLessThan(160);
    const got = await t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id: job.id } });
    expect(got.state).toBe('FAILED');
    expect(got.message).toMatch(/the adapter was refused: the upload inflates/);
    expect(await refusals('uploadTrainArtifact')).toBe(audits + 1);
  }, 120_000);
});
