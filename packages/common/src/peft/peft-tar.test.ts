import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pipeline, Readable } from 'node:stream';
import zlib from 'node:zlib';
import tar from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PeftTarError, type PeftTarLimits, packDirectory, readPeftTar } from './peft-tar.js';

// Hostile tars are made here with tar-stream's pack(), which writes whatever type, name and link a header says:
// the same freedom an attacker's tar has.

type Entry = { header: tar.Headers; body?: Buffer | string };

const CONFIG = JSON.stringify({ peft_type: 'LORA', r: 8, lora_alpha: 16, target_modules: ['q_proj', 'v_proj'] });
/** A safetensors file in shape (u64 header length, JSON header, data): enough for a tar reader, which only counts. */
function safetensors(): Buffer {
  const header = Buffer.from(
    JSON.stringify({ 'a.lora_A.weight': { dtype: 'F32', shape: [2, 2], data_offsets: [0, 16] } }),
  );
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(header.length));
  return Buffer.concat([len, header, Buffer.alloc(16, 1)]);
}

const config = (name = 'adapter_config.json'): Entry => ({ header: { name }, body: CONFIG });
const weights = (name = 'adapter_model.safetensors'): Entry => ({ header: { name }, body: safetensors() });

async function collect(stream: AsyncIterable<Buffer>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(c);
  return Buffer.concat(chunks);
}

/** A gzipped tar of these entries, in order. */
async function tgz(entries: Entry[]): Promise<Buffer> {
  const pack = tar.pack();
  const out = collect(Readable.from(pack).pipe(zlib.createGzip()));
  for (const e of entries) {
    await new Promise<void>((resolve, reject) => {
      const cb = (err?: Error | null) => (err ? reject(err) : resolve());
      if (e.body === undefined) pack.entry(e.header, cb).end();
      else pack.entry(e.header, e.body, cb);
    });
  }
  pack.finalize();
  return out;
}

/** The refusal readPeftTar gives for this upload: it must be a PeftTarError, not some other failure. */
async function refusal(upload: Buffer, limits?: Partial<PeftTarLimits>): Promise<PeftTarError> {
  const err = await readPeftTar(Readable.from([upload]), limits).then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(PeftTarError);
  return err as PeftTarError;
}

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

let dir: string;
beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-peft-tar-'));
});
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true });
});

describe('a good adapter', () => {
  it('round-trips through packDirectory and readPeftTar with names, sizes and hashes intact', async () => {
    const out = path.join(dir, 'out');
    await fs.mkdir(path.join(out, 'checkpoint-10'), { recursive: true });
    const files: Record<string, Buffer> = {
      'adapter_config.json': Buffer.from(CONFIG),
      'adapter_model.safetensors': Buffer.concat([safetensors(), Buffer.alloc(300_000, 7)]),
      'README.md': Buffer.from('# adapter\n'),
      'tokenizer.json': Buffer.from(JSON.stringify({ model: { vocab: { a: 0 } } })),
      'special_tokens_map.json': Buffer.from('{}'),
    };
    for (const [name, body] of Object.entries(files)) await fs.writeFile(path.join(out, name), body);
    // A trainer's checkpoint directory is not the adapter and stays behind.
    await fs.writeFile(path.join(out, 'checkpoint-10', 'optimizer.pt'), 'x');

    const upload = await collect(packDirectory(out));
    const got = await readPeftTar(Readable.from([upload]));

    expect(got.files.map((f) => f.name).sort()).toEqual(Object.keys(files).sort());
    for (const f of got.files) {
      const body = files[f.name]!;
      expect(f.size).toBe(body.length);
      expect(f.sha256).toBe(sha256(body));
    }
    expect(got.config).toEqual(JSON.parse(CONFIG));
    expect(got.weights.equals(files['adapter_model.safetensors']!)).toBe(true);
    expect(got.compressedBytes).toBe(upload.length);
    expect(got.sha256).toBe(sha256(upload));
  });

  it('takes a "./" root and "./"-prefixed names, as `tar -C out .` writes them', async () => {
    const upload = await tgz([
      { header: { name: './', type: 'directory' } },
      config('./adapter_config.json'),
      weights('./adapter_model.safetensors'),
    ]);
    const got = await readPeftTar(Readable.from([upload]));
    expect(got.files.map((f) => f.name)).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
  });

  it('reads what GNU tar makes of a directory', async (ctx) => {
    // The operator's way of packing an adapter by hand; skipped where no tar binary is installed.
    try {
      execFileSync('tar', ['--version'], { stdio: 'ignore' });
    } catch {
      ctx.skip();
    }
    const out = path.join(dir, 'gnu');
    await fs.mkdir(out);
    await fs.writeFile(path.join(out, 'adapter_config.json'), CONFIG);
    await fs.writeFile(path.join(out, 'adapter_model.safetensors'), safetensors());
    const upload = execFileSync('tar', ['-czf', '-', '-C', out, '.']);
    const got = await readPeftTar(Readable.from([upload]));
    expect(got.files.map((f) => f.name).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
  });
});

describe('packDirectory', () => {
  it('refuses a symlink in the directory instead of following it', async () => {
    const out = path.join(dir, 'linked');
    await fs.mkdir(out);
    await fs.writeFile(path.join(out, 'adapter_config.json'), CONFIG);
    await fs.symlink('/etc/passwd', path.join(out, 'adapter_model.safetensors'));
    await expect(collect(packDirectory(out))).rejects.toThrow(/adapter_model\.safetensors is a symlink/);
  });
});

describe('hostile tars are refused, naming the entry', () => {
  const cases: [string, () => Promise<Buffer>, RegExp, Partial<PeftTarLimits>?][] = [
    [
      'traversal',
      () => tgz([config('../adapter_config.json'), weights()]),
      /"\.\.\/adapter_config\.json" is a path that climbs out/,
    ],
    [
      'an absolute name',
      () => tgz([config(), { header: { name: '/etc/x' }, body: 'x' }]),
      /"\/etc\/x" is an absolute path/,
    ],
    [
      'a nested name',
      () => tgz([config(), { header: { name: 'a/b' }, body: 'x' }]),
      /"a\/b" is a path into a subdirectory/,
    ],
    [
      'a symlink',
      () =>
        tgz([config(), { header: { name: 'adapter_model.safetensors', type: 'symlink', linkname: '/etc/passwd' } }]),
      /"adapter_model\.safetensors" is a symlink to "\/etc\/passwd": the adapter tar holds regular files only/,
    ],
    [
      'a hard link',
      () =>
        tgz([
          config(),
          { header: { name: 'adapter_model.safetensors', type: 'link', linkname: 'adapter_config.json' } },
        ]),
      /"adapter_model\.safetensors" is a hard link to "adapter_config\.json"/,
    ],
    [
      'a character device',
      () => tgz([{ header: { name: 'README.md', type: 'character-device', devmajor: 1, devminor: 3 } }]),
      /"README\.md" is a character device/,
    ],
    ['a directory', () => tgz([{ header: { name: 'adapter', type: 'directory' } }]), /"adapter\/?" is a directory/],
    [
      'an unknown name',
      () => tgz([config(), { header: { name: 'run.sh' }, body: 'rm -rf /' }]),
      /"run\.sh" is not a file of a PEFT adapter; accepted: adapter_config\.json/,
    ],
    [
      'an adapter_model.bin pickle',
      () => tgz([config(), { header: { name: 'adapter_model.bin' }, body: 'pickle' }]),
      /"adapter_model\.bin" is a pickle .* loading a pickle runs code: save the adapter with save_pretrained\(out_dir, safe_serialization=True\)/,
    ],
    [
      'a duplicate',
      () => tgz([config(), weights(), config('./adapter_config.json')]),
      /"adapter_config\.json" appears twice/,
    ],
    [
      'too many entries',
      () =>
        tgz([
          config(),
          weights(),
          { header: { name: 'README.md' }, body: 'x' },
          { header: { name: 'tokenizer.json' }, body: '{}' },
        ]),
      /more than 3 entries \(at "tokenizer\.json"\)/,
      { maxEntries: 3 },
    ],
    [
      'an oversize JSON file',
      () => tgz([{ header: { name: 'adapter_config.json' }, body: Buffer.alloc(1024 ** 2 + 1, 0x20) }, weights()]),
      /"adapter_config\.json" is 1048577 bytes; at most 1048576 are accepted/,
    ],
    [
      'oversize weights',
      () => tgz([config(), weights()]),
      /"adapter_model\.safetensors" is \d+ bytes; at most 64 are accepted/,
      { maxWeightBytes: 64 },
    ],
    [
      'files over the total',
      () => tgz([config(), weights(), { header: { name: 'tokenizer.json' }, body: Buffer.alloc(4096, 0x20) }]),
      /the files add up to more than 4200 bytes \(at "tokenizer\.json"\)/,
      { maxTotalBytes: 4200 },
    ],
    [
      'a huge pax record',
      // Random, so that it does not compress and only the overhead cap can stop it.
      () =>
        tgz([
          config(),
          {
            header: {
              name: 'README.md',
              pax: { comment: randomBytes(4 * 1024 ** 2).toString('base64') },
            } as tar.Headers,
            body: 'x',
          },
        ]),
      /over 4194304 bytes that are not file data/,
    ],
    ['no adapter_config.json', () => tgz([weights()]), /the tar has no adapter_config\.json/],
    ['no safetensors', () => tgz([config()]), /the tar has no adapter_model\.safetensors/],
    [
      'a config that is not JSON',
      () => tgz([{ header: { name: 'adapter_config.json' }, body: '{"r": 8,' }, weights()]),
      /adapter_config\.json is not JSON/,
    ],
  ];

  for (const [what, make, message, limits] of cases) {
    it(`refuses ${what}`, async () => {
      const err = await refusal(await make(), limits);
      expect(err.message).toMatch(message);
    });
  }

  it('refuses a truncated gzip stream', async () => {
    const good = await tgz([config(), weights()]);
    const err = await refusal(good.subarray(0, good.length - 12));
    expect(err.message).toMatch(/the gzip stream ends early/);
  });

  it('refuses an upload that is not gzip', async () => {
    const err = await refusal(Buffer.from('PK\x03\x04 a zip, say'));
    expect(err.message).toMatch(/not a valid gzip stream/);
  });

  it('refuses a tar cut short inside an entry', async () => {
    const pack = tar.pack();
    const raw = collect(Readable.from(pack));
    pack.entry({ name: 'adapter_config.json' }, CONFIG);
    pack.entry({ name: 'adapter_model.safetensors' }, Buffer.alloc(4096, 1));
    pack.finalize();
    const cut = (await raw).subarray(0, 512 + 512 + 512 + 1024);
    const err = await refusal(zlib.gzipSync(cut));
    expect(err.message).toMatch(/the tar ends inside an entry/);
  });

  it('refuses a gzip of something that is not a tar', async () => {
    const err = await refusal(zlib.gzipSync(Buffer.alloc(2048, 0x41)));
    expect(err.message).toMatch(/the tar is corrupt or not a tar/);
  });
});

describe('a gzip bomb', () => {
  it('is refused after reading a sliver of it, in bounded memory', async () => {
    // 1.25 GiB of zeros as adapter_model.safetensors (under the 2 GiB cap, so only the ratio can stop it), made
    // by streaming one 1 MiB buffer through gzip on demand: the test never holds the bomb either.
    const claimed = 1.25 * 1024 ** 3;
    const zeros = Buffer.alloc(1024 ** 2);
    const stop = new AbortController();
    let generated = 0;
    const pack = tar.pack();
    const writing = (async () => {
      pack.entry({ name: 'adapter_config.json' }, CONFIG);
      const entry = pack.entry({ name: 'adapter_model.safetensors', size: claimed });
      while (generated < claimed && !stop.signal.aborted) {
        generated += zeros.length;
        if (!entry.write(zeros)) await once(entry, 'drain', { signal: stop.signal });
      }
      entry.end();
      pack.finalize();
    })().catch(() => {});
    const upload = pipeline(Readable.from(pack), zlib.createGzip({ level: 1 }), () => {});

    const before = process.memoryUsage();
    let peakRss = before.rss;
    let peakHeldJs = before.heapUsed + before.arrayBuffers;
    async function* sampled() {
      for await (const chunk of upload) {
        const m = process.memoryUsage();
        peakRss = Math.max(peakRss, m.rss);
        peakHeldJs = Math.max(peakHeldJs, m.heapUsed + m.arrayBuffers);
        yield chunk as Buffer;
      }
    }

    const err = await readPeftTar(sampled()).then(
      () => null,
      (e: unknown) => e,
    );
    // Once more after the refusal: the reserved safetensors buffer may not yet be collected.
    const after = process.memoryUsage();
    peakRss = Math.max(peakRss, after.rss);
    peakHeldJs = Math.max(peakHeldJs, after.heapUsed + after.arrayBuffers);
    stop.abort();
    upload.destroy();
    pack.destroy();
    await writing;

    expect(err).toBeInstanceOf(PeftTarError);
    expect((err as Error).message).toMatch(/the upload inflates \d+× .* refused as a gzip bomb/);
    const MiB = 1024 ** 2;
    const rssGrowth = (peakRss - before.rss) / MiB;
    console.info(
      `gzip bomb: refused after ${Math.round(generated / MiB)} MiB of ${claimed / MiB} MiB made; ` +
        `rss +${rssGrowth.toFixed(1)} MiB, heapUsed+arrayBuffers +${((peakHeldJs - before.heapUsed - before.arrayBuffers) / MiB).toFixed(1)} MiB`,
    );
    // The reader stopped the stream: most of the bomb was never made, let alone inflated.
    expect(generated).toBeLessThan(256 * MiB);
    // Resident memory, not heapUsed+arrayBuffers: the safetensors buffer is reserved at its capped declared size
    // and only the pages written are resident, so rss is what would show a bomb being held.
    expect(rssGrowth).toBeLessThan(200);
  });
});
