import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { modelHeader } from '@hangar/common/test/fixtures/gguf-writer';
import { createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { startFakeHub } from '../test/fixtures/fake-hub.js';

// What judging a repository costs, against the stand-in Hub on loopback: bytes read to judge each set against
// the set's size (the ratio that matters: a verdict must not cost a download), and the time to open a
// repository of 40 files, against the time the Hub's own listing calls take on the same socket (the baseline).

const GB = 1024 ** 3;
const hub = await startFakeHub();
const files = [];
const quants = [
  'Q2_K',
  'Q3_K_S',
  'Q3_K_M',
  'Q3_K_L',
  'Q4_0',
  'Q4_K_S',
  'Q4_K_M',
  'Q5_K_S',
  'Q5_K_M',
  'Q6_K',
  'Q8_0',
  'IQ4_XS',
  'IQ3_M',
  'IQ2_M',
];
for (const [i, q] of quants.entries()) {
  // A real-sized header: a 152k-token vocabulary makes it a few MB, as in Qwen's own files.
  const { header } = modelHeader({
    arch: 'qwen3',
    layers: 36,
    embd: 4096,
    heads: 32,
    kvHeads: 8,
    ctx: 40960,
    fileType: 15,
    vocab: 151_936,
  });
  files.push({ path: `Big-Model-${q}.gguf`, head: header, size: (2 + i) * GB, lfs: true });
}
for (let n = 1; n <= 24; n++) {
  // Only the first shard carries the metadata (and the vocabulary), as gguf-py writes them.
  const { header } = modelHeader({
    arch: 'qwen3',
    layers: 36,
    embd: 4096,
    heads: 32,
    kvHeads: 8,
    split: { no: n - 1, count: 24 },
    vocab: n === 1 ? 151_936 : 0,
  });
  files.push({
    path: `F16/Big-Model-F16-${String(n).padStart(5, '0')}-of-00024.gguf`,
    head: header,
    size: 4 * GB,
    lfs: true,
  });
}
files.push({ path: 'README.md', head: Buffer.from('# Big model\n'), size: 12 });
files.push({ path: 'mmproj-Big-Model-F16.gguf', head: modelHeader({ arch: 'clip' }).header, size: GB / 2, lfs: true });
// Several copies of the repository: the registry keeps what it has judged, so each timed open is of one not seen.
const SAMPLES = 7;
for (let i = 0; i < SAMPLES; i++) {
  const id = `bench/Big-Model-GGUF-${i}`;
  hub.repos.set(id, { id, sha: 'f'.repeat(40), tags: ['gguf'], files });
}

const root = path.join(os.tmpdir(), `hangar-bench-registry-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_HUB_URL: hub.url,
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
await app.start();

// Interleaved: the Hub's two listing calls alone (the baseline), then Hangar opening the same repository, each
// of SAMPLES times; one sample of the baseline ranged 28–168 ms from run to run on this machine.
const baselines: number[] = [];
const opens: number[] = [];
let opened: Awaited<ReturnType<typeof app.services.registry.repo>> | undefined;
for (let i = 0; i < SAMPLES; i++) {
  const id = `bench/Big-Model-GGUF-${i}`;
  const baselineStart = performance.now();
  for (const p of [`/api/models/${id}/revision/main`, `/api/models/${id}/tree/${'f'.repeat(40)}?recursive=true`]) {
    await (await fetch(hub.url + p)).text();
  }
  baselines.push(performance.now() - baselineStart);
  const started = performance.now();
  opened = await app.services.registry.repo({ id });
  opens.push(performance.now() - started);
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const spread = (xs: number[]) => `${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}`;
const baselineMs = median(baselines);
const openMs = median(opens);
if (!opened?.ok) throw new Error(opened?.error.message ?? 'no sample');
const sets = opened.value.sets;
const read = sets.reduce((n, s) => n + s.headerBytesRead, 0);
const size = sets.reduce((n, s) => n + s.totalBytes, 0);

console.log(
  `Opening a repository of ${files.length} files (${sets.length} sets, ${(size / GB).toFixed(1)} GiB) on the stand-in Hub, loopback`,
);
console.log(
  `  the Hub's two listing calls alone (baseline)   ${baselineMs.toFixed(1)} ms (${spread(baselines)}, median of ${SAMPLES})`,
);
console.log(
  `  registryRepo, every set judged                 ${openMs.toFixed(1)} ms (${spread(opens)})  ${(openMs / baselineMs).toFixed(1)}× baseline`,
);
console.log(
  `  bytes read to judge: ${(read / 2 ** 20).toFixed(2)} MiB of ${(size / GB).toFixed(1)} GiB = ${((read / size) * 100).toExponential(2)} % of the sets' size`,
);
for (const s of sets.slice(0, 3)) {
  console.log(
    `    ${s.id.padEnd(28)} ${(s.totalBytes / GB).toFixed(1).padStart(5)} GiB  read ${(s.headerBytesRead / 1024).toFixed(0)} KiB  ${s.verdict.servable ? 'servable' : s.verdict.reason}`,
  );
}

await app.stop();
await hub.close();
await fs.rm(root, { recursive: true, force: true });
