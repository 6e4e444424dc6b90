import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { type Browser, type CDPSession, chromium, type Page } from 'playwright-core';
import { createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { notify } from '../src/pubsub.js';

// The console's Mirror page in Chromium, against a real Hangar, at 5000 versions and at 50 (the baseline, the same
// page in the same run, interleaved): how long after the listing's bytes have arrived the first rows are in the page
// and painted, the DOM and heap it holds, the main-thread work one live progress event costs (Chromium's own task
// time from the event until its row shows it, less a quiet page's), and the frames while scrolling down the list.
// Needs a built console (pnpm --filter @hangar/web build) and Chromium at /usr/bin/chromium (or CHROMIUM).
//   tsx bench/console-mirror.ts [versions=5000] [rounds=2] [web dist=../web/dist]

const VERSIONS = Number(process.argv[2] ?? 5000);
const ROUNDS = Number(process.argv[3] ?? 2);
const dist = path.resolve(process.argv[4] ?? new URL('../../web/dist', import.meta.url).pathname);
const BASELINE = 50;
const EVENTS = 3;
const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';

const missing = await fs.access(path.join(dist, 'index.html')).then(
  () => null,
  () => `no built console at ${dist} (pnpm --filter @hangar/web build)`,
);
const noBrowser = await fs.access(chromiumPath).then(
  () => null,
  () => `no Chromium at ${chromiumPath} (set CHROMIUM)`,
);
if (missing || noBrowser) {
  console.log(`The Mirror page in Chromium: skipped, ${missing ?? noBrowser}`);
  process.exit(0);
}

const root = path.join(os.tmpdir(), `hangar-bench-console-mirror-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const password = 'correct-horse-battery';
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: password,
  HANGAR_WEB_DIST: dist,
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
const hangar = await app.start();
const db = app.db.prisma;

// Twenty families the way a mirror has them; each name's leading letters make its family (progress.ts).
const families = [
  'codellama',
  'command',
  'deepseek',
  'falcon',
  'gemma',
  'granite',
  'hermes',
  'llama',
  'mistral',
].concat(['nous', 'olmo', 'ops', 'phi', 'qwen', 'smol', 'starcoder', 'tiny', 'vicuna', 'yi', 'zephyr']);
// The one download under way, whose progress the events carry: first by name and first by state, so it is in view
// whichever order a build of the console lists by. Leased to a replica that is not this process, so nothing here
// picks the transfer up and the bench alone moves its bytes.
const LIVE = { model: 'aya-23-8b', version: 'Q4_K_M' };
const GiB = 1024 ** 3;

/** n versions of one file each (n - 1 present, one arriving), a catalog model on every tenth. */
async function seed(n: number) {
  await db.adapter.deleteMany();
  await db.catalogModel.deleteMany();
  await db.mirrorFile.deleteMany();
  const present = Array.from({ length: n - 1 }, (_, i) => ({
    model: `${families[i % families.length]}-${i}-instruct`,
    version: 'Q4_K_M',
    file: 'model.gguf',
    sourceUrl: `https://hub.example/${i}/model.gguf`,
    state: 'PRESENT' as const,
    bytesDone: 4_000_000_000n + BigInt(i),
    bytesTotal: 4_000_000_000n + BigInt(i),
    expectedSha256: 'a'.repeat(64),
    actualSha256: 'a'.repeat(64),
  }));
  await db.mirrorFile.createMany({ data: present });
  const live = await db.mirrorFile.create({
    data: {
      ...LIVE,
      file: 'model.gguf',
      sourceUrl: 'https://hub.example/aya/model.gguf',
      state: 'FETCHING',
      bytesDone: BigInt(GiB),
      bytesTotal: BigInt(4 * GiB),
      bytesPerSecond: 50 * 1024 ** 2,
      leaseOwner: 'bench-another-replica',
      leaseUntil: new Date(Date.now() + 3600_000),
    },
  });
  const models = present.filter((_, i) => i % 10 === 0);
  await db.catalogModel.createMany({
    data: models.map((f, i) => ({
      name: `model-${i}`,
      source: `${hangar}/mirror/${f.model}/${f.version}/model.gguf`,
      engine: 'llamacpp',
    })),
  });
  return live.id;
}

type Bench = { listings: number; dataAt: number; firstRowAt: number; paintedAt: number };

// What the page records for the bench: how many listing requests it sent, when the console had the first one's
// answer whole (its own read of the body resolved: urql reads a JSON answer with text()), when the first version
// row was in the DOM, and the next frame after it. The answer is timed on the console's read itself, not on a
// clone read beside it, which could finish before or after the console's and so move the start either way.
const instrument = () => {
  const bench: Bench = { listings: 0, dataAt: 0, firstRowAt: 0, paintedAt: 0 };
  (window as unknown as { __bench: Bench }).__bench = bench;
  const original = window.fetch;
  window.fetch = async (input, init) => {
    const res = await original(input, init);
    if (typeof init?.body === 'string' && init.body.includes('query MirrorPage_Mirror')) {
      bench.listings++;
      const read = res.text.bind(res);
      res.text = async () => {
        const body = await read();
        if (!bench.dataAt) bench.dataAt = performance.now();
        return body;
      };
    }
    return res;
  };
  const seen = new MutationObserver(() => {
    if (bench.firstRowAt || !document.querySelector('tr.version')) return;
    bench.firstRowAt = performance.now();
    seen.disconnect();
    requestAnimationFrame(() => {
      bench.paintedAt = performance.now();
    });
  });
  seen.observe(document, { childList: true, subtree: true });
};

async function taskSeconds(cdp: CDPSession) {
  const { metrics } = (await cdp.send('Performance.getMetrics')) as { metrics: { name: string; value: number }[] };
  const get = (name: string) => metrics.find((m) => m.name === name)?.value ?? 0;
  return { task: get('TaskDuration'), heap: get('JSHeapUsedSize') };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type Sample = {
  firstRowMs: number;
  paintedMs: number;
  domNodes: number;
  heapMiB: number;
  eventMs: number[];
  idleMs: number[];
  /** From the database's NOTIFY to the row showing it, to the 50 ms the bench looks. */
  shownMs: number[];
  fps: number;
  slowFrames: number;
  p95FrameMs: number;
};

async function measure(browser: Browser, n: number): Promise<Sample> {
  const liveId = await seed(n);
  const context = await browser.newContext({ baseURL: hangar, viewport: { width: 1280, height: 900 } });
  await context.addInitScript(instrument);
  const page: Page = await context.newPage();
  await page.goto('/');
  await page.getByLabel('Email').fill('admin@hangar.local');
  await page.getByLabel('Password').fill(password);
  // One load: signing in lands on /mirror, whose listing request is the one timed. (Loading /mirror again after it
  // sent a second listing while the first could still be answering, and the page's clock started on either.)
  const listing = page.waitForResponse(
    (res) => res.request().postData()?.includes('query MirrorPage_Mirror') === true && res.ok(),
    { timeout: 60_000 },
  );
  await page.getByRole('button', { name: 'Sign in' }).click();
  await listing;
  await page.waitForURL('**/mirror');
  await page.locator('tr.version').first().waitFor({ timeout: 60_000 });
  await page.waitForFunction(() => (window as unknown as { __bench: Bench }).__bench.paintedAt > 0);
  const b = await page.evaluate(() => (window as unknown as { __bench: Bench }).__bench);
  if (b.listings !== 1 || !b.dataAt || b.firstRowAt < b.dataAt) {
    throw new Error(
      `the first load sent ${b.listings} listing requests (answer read at ${b.dataAt.toFixed(0)} ms, first row at ${b.firstRowAt.toFixed(0)} ms): the bench times one listing to its first rows; see how the console now reaches /mirror after sign-in`,
    );
  }
  const cdp = await context.newCDPSession(page);
  await cdp.send('Performance.enable');
  await sleep(1500);
  const domNodes = await page.evaluate(() => document.getElementsByTagName('*').length);
  const heapMiB = (await taskSeconds(cdp)).heap / 1024 ** 2;

  // One live event at a time: the bytes move in the database and the version is announced, as a transfer does.
  const bar = page.getByRole('progressbar', { name: `${LIVE.model}/${LIVE.version} progress` });
  const eventMs: number[] = [];
  const idleMs: number[] = [];
  const shownMs: number[] = [];
  for (let e = 0; e < EVENTS; e++) {
    const i0 = await taskSeconds(cdp);
    await sleep(1000);
    const i1 = await taskSeconds(cdp);
    const idlePerMs = (i1.task - i0.task) / 1000;
    const before = await bar.getAttribute('aria-valuenow');
    const t0 = await taskSeconds(cdp);
    const sent = performance.now();
    await db.mirrorFile.update({ where: { id: liveId }, data: { bytesDone: BigInt(GiB + (e + 1) * 100 * 1024 ** 2) } });
    await notify(db, 'mirrorVersion', `${LIVE.model}/${LIVE.version}`);
    // Until the row shows it (a page that re-renders every row takes seconds here), and a moment for what follows.
    let shown = true;
    while ((await bar.getAttribute('aria-valuenow')) === before) {
      // Recorded as not shown, and measured all the same: what the page spent in those 30 s is the number.
      if (performance.now() - sent > 30_000) {
        shown = false;
        break;
      }
      await sleep(50);
    }
    shownMs.push(shown ? performance.now() - sent : Number.POSITIVE_INFINITY);
    await sleep(500);
    const t1 = await taskSeconds(cdp);
    const windowMs = performance.now() - sent;
    idleMs.push(idlePerMs * windowMs * 1000);
    eventMs.push((t1.task - t0.task) * 1000);
  }

  // Scrolling down the list for two seconds, a step every frame, as a wheel held down does.
  // A string, not a function: tsx names the functions it compiles with a helper the page does not have.
  const frames = (await page.evaluate(`new Promise((resolve) => {
    const deltas = [];
    let last = performance.now();
    const end = last + 2000;
    function step(now) {
      deltas.push(now - last);
      last = now;
      window.scrollBy(0, 120);
      if (now < end) requestAnimationFrame(step);
      else resolve(deltas);
    }
    requestAnimationFrame(step);
  })`)) as number[];
  frames.shift();
  const sorted = [...frames].sort((x, y) => x - y);
  const seconds = frames.reduce((s, d) => s + d, 0) / 1000;
  await context.close();
  return {
    firstRowMs: b.firstRowAt - b.dataAt,
    paintedMs: b.paintedAt - b.dataAt,
    domNodes,
    heapMiB,
    eventMs,
    idleMs,
    shownMs,
    fps: frames.length / seconds,
    slowFrames: frames.filter((d) => d > 1000 / 60 + 8).length,
    p95FrameMs: sorted[Math.floor(sorted.length * 0.95)] ?? 0,
  };
}

const browser = await chromium.launch({
  executablePath: chromiumPath,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update'],
});
const samples: Record<number, Sample[]> = { [BASELINE]: [], [VERSIONS]: [] };
try {
  for (let r = 0; r < ROUNDS; r++) {
    // Alternating which size goes first, so neither always meets a warmer browser.
    for (const n of r % 2 === 0 ? [BASELINE, VERSIONS] : [VERSIONS, BASELINE])
      samples[n]?.push(await measure(browser, n));
  }
} finally {
  await browser.close();
  await app.stop();
  await fs.rm(root, { recursive: true, force: true });
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const spread = (xs: number[]) => `${Math.min(...xs).toFixed(0)}–${Math.max(...xs).toFixed(0)}`;
console.log(
  `The Mirror page in Chromium (${path.relative(process.cwd(), dist) || dist}), ${VERSIONS} versions against ${BASELINE}, ${ROUNDS} interleaved rounds, ${os.cpus().length} cores`,
);
for (const n of [BASELINE, VERSIONS]) {
  const s = samples[n] ?? [];
  const pick = (f: (x: Sample) => number) => s.map(f);
  // The event's own work: the task time from the event until the row showed it (and half a second after), less
  // what a quiet page spends in as long, never below zero.
  const events = s.flatMap((x) => x.eventMs.map((ms, i) => Math.max(0, ms - (x.idleMs[i] ?? 0))));
  console.log(
    `  ${String(n).padStart(5)} versions: first row ${median(pick((x) => x.firstRowMs)).toFixed(0)} ms (${spread(pick((x) => x.firstRowMs))}), painted ${median(pick((x) => x.paintedMs)).toFixed(0)} ms after the data; ` +
      `${median(pick((x) => x.domNodes))} DOM nodes, ${median(pick((x) => x.heapMiB)).toFixed(0)} MiB heap; ` +
      `one live event ${median(events).toFixed(1)} ms main-thread work (${spread(events)}; quiet page ${median(s.flatMap((x) => x.idleMs)).toFixed(1)} ms in as long; on the row ${median(s.flatMap((x) => x.shownMs)).toFixed(0)} ms after); ` +
      `scrolling ${median(pick((x) => x.fps)).toFixed(0)} fps, p95 frame ${median(pick((x) => x.p95FrameMs)).toFixed(1)} ms, ${median(pick((x) => x.slowFrames))} slow frames`,
  );
}
