import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { type Browser, type CDPSession, chromium, type Page } from 'playwright-core';
import { createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { notify } from '../src/pubsub.js';

// The console's Mirror page in Chromium, against a real Hangar, at 5000 versions and at 50 (the baseline, the same
// page in the same run, interleaved, each sample in a browser of its own): how long after the listing's bytes have
// arrived the first rows are in the page and painted, the DOM and heap it holds, the main-thread work of one live
// progress event, and the frames while scrolling through the list.
// Everything timed is timed inside the page, never by polling it from here: each look over the debug protocol is
// a task on the page's main thread, and polling every 50 ms cost the page more than the event it was timing.
// Needs a built console (pnpm --filter @hangar/web build) and Chromium at /usr/bin/chromium (or CHROMIUM).
//   tsx bench/console-mirror.ts [versions=5000] [rounds=3] [web dist=../web/dist] [--events=30] [--hogs=1] [--profile=DIR] [--trace=DIR] [--shots=DIR] [--layers]
// --hogs=N busy processes of their own beside the browser for the whole run, both sizes alike (an operator's
// laptop compiling, a VM sharing its cores): the goal is 60 fps with one there, as at 50 versions. --hogs=0 for none.
// --profile writes Chromium CPU profiles (DevTools' .cpuprofile) of the events and of the scrolling, at both sizes,
// to DIR; --trace=DIR their timeline traces (style, layout, paint by frame), for DevTools' Performance panel;
// --shots=DIR screenshots of the page at the larger size, 1280 and 800 px wide; --layers the tiles rastered while
// scrolling by compositor layer, and how much of each was invalidated.

if (process.argv.includes('--help')) {
  console.log(
    'tsx bench/console-mirror.ts [versions=5000] [rounds=3] [web dist=../web/dist] [--events=30] [--hogs=1] [--profile=DIR] [--trace=DIR] [--shots=DIR] [--layers]',
  );
  process.exit(0);
}
const flag = (name: string) =>
  process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? undefined;
const positional = process.argv.slice(2).filter((a) => !a.startsWith('--'));
const VERSIONS = Number(positional[0] ?? 5000);
const ROUNDS = Number(positional[1] ?? 3);
const dist = path.resolve(positional[2] ?? new URL('../../web/dist', import.meta.url).pathname);
const BASELINE = 50;
const EVENTS = Number(flag('events') ?? 30);
const HOGS = Number(flag('hogs') ?? 1);
const profileDir = flag('profile');
const traceDir = flag('trace');
const shotsDir = flag('shots');
const showLayers = process.argv.includes('--layers');
// The compositor's layers each frame, with the region of each that was invalidated (DevTools' Layers panel).
const LAYERS = 'disabled-by-default-devtools.timeline.layers';
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
    // A file of its own each, as a mirror has: the disk used adds up 5000 copies, not one linked 5000 times.
    expectedSha256: i.toString(16).padStart(64, '0'),
    actualSha256: i.toString(16).padStart(64, '0'),
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

// What the page records of each live event and of scrolling, in plain JavaScript (tsx would name the functions it
// compiles with a helper the page does not have). The console's WebSocket gets a listener of the bench's before its
// own (graphql-ws sets onmessage after making the socket), so the clock starts when the event's message reaches the
// page. From there: the message's task to its end (urql and React render and commit in its microtasks), the commit
// that puts the new bytes on the row, and the frame after it (its rAF, then a message posted from there, which runs
// once that frame's style, layout and paint are done). Which row groups (tbody) the DOM changed in says whether the
// event touched only its own row. Long tasks (over 50 ms) are kept for the bench to add up.
const liveScript = `(() => {
  const live = (window.__live = { longTasks: [], watch: null, result: null });
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) live.longTasks.push([e.startTime, e.duration]);
    }).observe({ type: 'longtask', buffered: true });
  } catch {}
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', (m) => {
        const w = live.watch;
        if (!w || typeof m.data !== 'string' || !m.data.includes('mirrorChanged') || !m.data.includes(w.marker)) return;
        live.watch = null;
        follow(performance.now(), w);
      });
    }
  };
  const value = (selector) => document.querySelector(selector)?.getAttribute('aria-valuenow') ?? null;
  function follow(t0, w) {
    // The 5 s re-read of arriving versions got there first: this event changes nothing on the page.
    if (value(w.selector) !== w.before) return w.resolve({ raced: true });
    const rec = { t0, taskEnd: 0, commit: 0, raf: 0, done: 0, groups: 0 };
    const groups = new Set();
    const note = (records) => {
      for (const r of records) {
        const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
        const group = el && el.closest('tbody');
        if (group) groups.add(group);
      }
    };
    const touched = new MutationObserver(note);
    touched.observe(document.body, { subtree: true, childList: true, attributes: true, characterData: true });
    const finish = () => {
      if (!rec.taskEnd || !rec.done) return;
      note(touched.takeRecords());
      touched.disconnect();
      rec.groups = groups.size;
      w.resolve(rec);
    };
    const end = new MessageChannel();
    end.port1.onmessage = () => { rec.taskEnd = performance.now(); finish(); };
    end.port2.postMessage(0);
    const shown = new MutationObserver(() => {
      if (rec.commit || value(w.selector) === w.before) return;
      rec.commit = performance.now();
      shown.disconnect();
      requestAnimationFrame(() => {
        rec.raf = performance.now();
        const after = new MessageChannel();
        after.port1.onmessage = () => { rec.done = performance.now(); finish(); };
        after.port2.postMessage(0);
      });
    });
    shown.observe(document.body, { subtree: true, attributes: true, attributeFilter: ['aria-valuenow'] });
  }
  live.arm = (selector, marker) => {
    let resolve;
    live.result = new Promise((r) => { resolve = r; });
    live.watch = { selector, marker, before: value(selector), resolve };
    setTimeout(() => resolve(null), 30000);
  };
  // Two seconds of scrolling, a step every frame as a held-down wheel does, over the listing alone and turning at
  // either end of it, so a short list scrolls through rows as long as a long one (not over the page around it).
  // Every frame's interval, and how far it went.
  live.scroll = (ms, step) => new Promise((resolve) => {
    const frames = [];
    let last = 0;
    let dir = 1;
    let distance = 0;
    const list = document.querySelector('table.mirror');
    const table = list.getBoundingClientRect();
    // Each change of the listing's height changes the page's: Chromium paints what it sizes again, behind the rows.
    let height = list.style.height;
    let heightChanges = 0;
    const sized = new MutationObserver(() => {
      if (list.style.height !== height) heightChanges++;
      height = list.style.height;
    });
    sized.observe(list, { attributes: true, attributeFilter: ['style'] });
    const top = Math.max(0, table.top + window.scrollY);
    const bottom = Math.max(top, table.bottom + window.scrollY - window.innerHeight);
    window.scrollTo(0, top);
    const start = performance.now();
    const tick = (now) => {
      if (last) frames.push(now - last);
      last = now;
      if (dir > 0 && window.scrollY >= bottom - 1) dir = -1;
      else if (dir < 0 && window.scrollY <= top + 1) dir = 1;
      const was = window.scrollY;
      window.scrollBy(0, dir * step);
      distance += Math.abs(window.scrollY - was);
      if (now - start < ms) requestAnimationFrame(tick);
      else {
        sized.disconnect();
        resolve({ frames, distance, start, end: now, heightChanges });
      }
    };
    requestAnimationFrame(tick);
  });
})()`;

type EventRecord = { t0: number; taskEnd: number; commit: number; raf: number; done: number; groups: number };
type Live = {
  longTasks: [number, number][];
  arm: (selector: string, marker: string) => void;
  result: Promise<EventRecord | { raced: true } | null>;
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Long-task time (over 50 ms, Chromium's longtask entries) that overlaps [from, to]. */
const longIn = (tasks: [number, number][], from: number, to: number) =>
  tasks.reduce((sum, [start, d]) => sum + Math.max(0, Math.min(to, start + d) - Math.max(from, start)), 0);

type Event = {
  /** The message's task (urql, React's render and commit), then the frame's rendering: the page's work for it. */
  workMs: number;
  scriptMs: number;
  renderMs: number;
  /** From the message to the frame that shows it, the wait for that frame included. */
  shownMs: number;
  /** Row groups the DOM changed in: the version's row, and its family's heading whose bytes add it up. */
  groups: number;
  longMs: number;
  /** React committed after the message's task: the work is then counted to the commit, waits and all. */
  deferred: boolean;
};

type Sample = {
  firstRowMs: number;
  paintedMs: number;
  domNodes: number;
  heapMiB: number;
  events: Event[];
  fps: number;
  longestFrameMs: number;
  p95FrameMs: number;
  pxPerFrame: number;
  scrollLongMs: number;
  /** How often the listing's height changed while scrolling (each one repaints what the page's height sizes). */
  heightChanges: number;
  /** The renderer's main thread while scrolling, per frame: the CPU its tasks took, and their wall time. */
  scrollCpuMsPerFrame: number;
  scrollBusyMsPerFrame: number;
  /** Tiles the compositor rastered per frame while scrolling: about a viewport's worth means it all was repainted. */
  scrollTilesPerFrame: number;
  /** The same page frozen with every row in it (its DOM, no script), scrolled the same way. */
  frozenFps: number;
  frozenTilesPerFrame: number;
};

type TraceEvent = {
  name?: string;
  ph?: string;
  pid?: number;
  tid?: number;
  dur?: number;
  tdur?: number;
  args?: { name?: string };
};

/** The time the renderer's main thread spent in tasks over a trace: on the CPU (thread time), and on the clock. */
function mainThreadTime(trace: Buffer): { cpuMs: number; wallMs: number; tiles: number } {
  const parsed = JSON.parse(trace.toString('utf8')) as { traceEvents?: TraceEvent[] } | TraceEvent[];
  const events = Array.isArray(parsed) ? parsed : (parsed.traceEvents ?? []);
  const main = new Set(
    events
      .filter((e) => e.ph === 'M' && e.name === 'thread_name' && e.args?.name === 'CrRendererMain')
      .map((e) => `${e.pid}:${e.tid}`),
  );
  let cpu = 0;
  let wall = 0;
  let tiles = 0;
  for (const e of events) {
    if (e.name === 'RasterTask' && e.ph === 'X') tiles++;
    if (e.name !== 'RunTask' || e.ph !== 'X' || !main.has(`${e.pid}:${e.tid}`)) continue;
    cpu += e.tdur ?? 0;
    wall += e.dur ?? 0;
  }
  return { cpuMs: cpu / 1000, wallMs: wall / 1000, tiles };
}

type LayerSnapshot = {
  layer_id: number;
  layer_name?: string;
  /** x, y, width, height of each rectangle invalidated since the last frame. */
  invalidation?: number[];
};

/**
 * --layers: the tiles rastered while scrolling, by the compositor layer they belong to (named after its element),
 * with how often and how much of each layer was invalidated, from the layer snapshots DevTools' Layers panel reads.
 * A layer's tiles are rastered again wherever it is invalidated, so this says which content drew the tiles: rows
 * that came in, rows that moved, or the page behind them.
 */
function printLayers(trace: Buffer, n: number) {
  const parsed = JSON.parse(trace.toString('utf8')) as { traceEvents?: TraceEvent[] } | TraceEvent[];
  const events = (Array.isArray(parsed) ? parsed : (parsed.traceEvents ?? [])) as (TraceEvent & {
    args?: {
      snapshot?: { active_tree?: { layers?: LayerSnapshot[] } };
      tileData?: { layerId?: number };
    };
  })[];
  const names = new Map<number, string>();
  const invalidated = new Map<string, { times: number; px: number }>();
  const ids = new Set<number>();
  for (const e of events) {
    if (e.name !== 'LayerTreeHostImpl:snapshot' || e.ph !== 'I') continue;
    for (const l of e.args?.snapshot?.active_tree?.layers ?? []) {
      // Every row group's layer is named after its element: one name for them all.
      const name = (l.layer_name ?? '?').includes('TBODY') ? 'row groups (tbody)' : (l.layer_name ?? '?');
      names.set(l.layer_id, name);
      ids.add(l.layer_id);
      const r = l.invalidation ?? [];
      if (!r.length) continue;
      const t = invalidated.get(name) ?? { times: 0, px: 0 };
      t.times++;
      for (let i = 0; i + 3 < r.length; i += 4) t.px += (r[i + 2] ?? 0) * (r[i + 3] ?? 0);
      invalidated.set(name, t);
    }
  }
  const tiles = new Map<string, number>();
  for (const e of events) {
    if (e.name !== 'RasterTask' || e.ph !== 'X') continue;
    const name = names.get(e.args?.tileData?.layerId ?? -1) ?? '?';
    tiles.set(name, (tiles.get(name) ?? 0) + 1);
  }
  console.log(`  tiles rastered while scrolling ${n} versions, by layer (${ids.size} layers came and went):`);
  for (const [name, count] of [...tiles].sort((x, y) => y[1] - x[1])) {
    const inv = invalidated.get(name);
    console.log(
      `    ${String(count).padStart(5)}  ${name}${inv ? `, invalidated ${inv.times}× (${(inv.px / 1e6).toFixed(1)} Mpx)` : ''}`,
    );
  }
}

/**
 * The page frozen with every row in it: its DOM without its scripts, in a page of its own with the same
 * stylesheets, the row groups it had copied on down the whole table (each under the one before), scrolled as the
 * live one is. Nothing runs while it scrolls: its frames are what this browser does to scroll the listing with all
 * its rows laid out, the page a virtualised list stands against. (Left as it was, only the rows in view and blank
 * below, it scrolled over space Chromium does not even raster: no measure of anything.)
 */
async function frozenScroll(browser: Browser, live: Page): Promise<{ fps: number; tilesPerFrame: number }> {
  await live.evaluate('window.scrollTo(0, 0)');
  const html = (await live.content())
    .replace(/<script\b[^>]*>[\s\S]*?<\/script>/gi, '')
    .replace('<head>', `<head><base href="${hangar}/">`)
    // From about:blank the stylesheet is another origin's, and asked for with CORS (Vite marks it crossorigin),
    // which Hangar does not grant: the frozen page was scrolled unstyled. Asked for plainly it loads.
    .replace(/\scrossorigin(="[^"]*")?/g, '');
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  try {
    const page = await context.newPage();
    await page.setContent(html, { waitUntil: 'load' });
    await page.evaluate(fillRows);
    await page.addScriptTag({ content: liveScript });
    await browser.startTracing(page, { categories: ['disabled-by-default-devtools.timeline'] });
    const { frames } = (await page.evaluate('window.__live.scroll(2000, 120)')) as { frames: number[] };
    const { tiles } = mainThreadTime(await browser.stopTracing());
    return {
      fps: frames.length / (frames.reduce((t, d) => t + d, 0) / 1000),
      tilesPerFrame: tiles / Math.max(1, frames.length),
    };
  } finally {
    await context.close();
  }
}

/** In the frozen page: the rendered row groups, copied over and over down the whole table, one under another. */
const fillRows = `(() => {
  const table = document.querySelector('table.mirror');
  // Unstyled (its stylesheet refused, as it was from about:blank), the page would measure nothing like the live one.
  if (getComputedStyle(table).display !== 'block') throw new Error('the frozen page has not got the console stylesheet');
  const groups = [...table.querySelectorAll(':scope > tbody')];
  const heights = groups.map((g) => g.getBoundingClientRect().height);
  if (!groups.length || heights.some((h) => h <= 0)) throw new Error('the frozen page has no row group to copy');
  const head = table.querySelector(':scope > thead').getBoundingClientRect().height;
  const full = table.getBoundingClientRect().height - head;
  const rows = document.createDocumentFragment();
  for (let i = 0, y = 0; y < full; i = (i + 1) % groups.length) {
    const copy = groups[i].cloneNode(true);
    copy.style.transform = 'translateY(' + (head + y) + 'px)';
    // Painted into the page as plain rows: a compositor layer for each of thousands (mirror.css gives the few live
    // ones a layer each) would measure the layers, not the page with every row laid out.
    copy.style.willChange = 'auto';
    rows.append(copy);
    y += heights[i];
  }
  for (const g of groups) g.remove();
  table.append(rows);
})()`;

async function profile<T>(
  browser: Browser,
  page: Page,
  cdp: CDPSession,
  name: string,
  n: number,
  run: () => Promise<T>,
): Promise<T> {
  if (!profileDir && !traceDir) return run();
  const file = (dir: string, ext: string) => path.join(dir, `${name}-${n}-${process.pid}-${Date.now()}.${ext}`);
  if (traceDir) {
    await fs.mkdir(traceDir, { recursive: true });
    await browser.startTracing(page, {
      path: file(traceDir, 'json'),
      categories: [
        'devtools.timeline',
        'disabled-by-default-devtools.timeline',
        'disabled-by-default-devtools.timeline.invalidationTracking',
        LAYERS,
        'blink',
        'cc',
        'renderer.scheduler',
      ],
    });
  }
  if (profileDir) {
    await cdp.send('Profiler.enable');
    await cdp.send('Profiler.setSamplingInterval', { interval: 100 });
    await cdp.send('Profiler.start');
  }
  try {
    return await run();
  } finally {
    if (traceDir) await browser.stopTracing();
    if (profileDir) {
      const { profile: p } = (await cdp.send('Profiler.stop')) as { profile: unknown };
      await fs.mkdir(profileDir, { recursive: true });
      await fs.writeFile(file(profileDir, 'cpuprofile'), JSON.stringify(p));
    }
  }
}

/** The page as the operator sees it at this size: the top, and well down the list, at 1280 and 800 px wide. */
async function shots(page: Page, n: number) {
  if (!shotsDir) return;
  await fs.mkdir(shotsDir, { recursive: true });
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 900 });
    await page.evaluate('window.scrollTo(0, 0)');
    await sleep(400);
    await page.screenshot({ path: path.join(shotsDir, `mirror-${n}-${width}-top.png`) });
    await page.evaluate('window.scrollTo(0, document.documentElement.scrollHeight * 0.6)');
    await sleep(400);
    await page.screenshot({ path: path.join(shotsDir, `mirror-${n}-${width}-scrolled.png`) });
    // How tall the row groups render, against the listing's estimates (mirror-table.tsx), for whoever tunes them.
    const heights = (await page.evaluate(
      `[...document.querySelectorAll('table.mirror > tbody[data-index]')].map((b) => [b.querySelector('tr.family') ? 'family' : 'version', Math.round(b.getBoundingClientRect().height)])`,
    )) as [string, number][];
    const seen = new Map<string, number>();
    for (const [kind, h] of heights) seen.set(`${kind} ${h} px`, (seen.get(`${kind} ${h} px`) ?? 0) + 1);
    console.log(
      `  screenshots at ${width} px in ${shotsDir}; row groups: ${[...seen].map(([k, c]) => `${c}× ${k}`).join(', ')}`,
    );
  }
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.evaluate('window.scrollTo(0, 0)');
}

async function measure(n: number): Promise<Sample> {
  const liveId = await seed(n);
  // A browser of its own for each sample: nothing compiled or cached for one size serves the other.
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update'],
  });
  try {
    const context = await browser.newContext({ baseURL: hangar, viewport: { width: 1280, height: 900 } });
    await context.addInitScript(instrument);
    await context.addInitScript({ content: liveScript });
    const page: Page = await context.newPage();
    await page.goto('/');
    await page.getByLabel('Email').fill('admin@hangar.local');
    await page.getByLabel('Password').fill(password);
    // One load: signing in lands on /mirror, whose listing request is the one timed. (Loading /mirror again after
    // it sent a second listing while the first could still be answering, and the page's clock started on either.)
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
    if (shotsDir && n === VERSIONS) await shots(page, n);
    const cdp = await context.newCDPSession(page);
    await cdp.send('Performance.enable');
    await sleep(1500);
    const domNodes = await page.evaluate(() => document.getElementsByTagName('*').length);
    const { metrics } = (await cdp.send('Performance.getMetrics')) as { metrics: { name: string; value: number }[] };
    const heapMiB = (metrics.find((m) => m.name === 'JSHeapUsedSize')?.value ?? 0) / 1024 ** 2;

    // One live event at a time, as a transfer sends them: the bytes move in the database and the version is
    // announced. The page is left alone while it handles one: the bench only awaits the page's own answer.
    const selector = `[role="progressbar"][aria-label="${LIVE.model}/${LIVE.version} progress"]`;
    const records: EventRecord[] = [];
    let raced = 0;
    await profile(browser, page, cdp, 'events', n, async () => {
      for (let e = 0; records.length < EVENTS; e++) {
        await sleep(250);
        const bytes = GiB + (e + 1) * 32 * 1024 ** 2;
        await page.evaluate(`window.__live.arm(${JSON.stringify(selector)}, ${JSON.stringify(String(bytes))})`);
        const result = page.evaluate('window.__live.result') as Promise<Awaited<Live['result']>>;
        await db.mirrorFile.update({ where: { id: liveId }, data: { bytesDone: BigInt(bytes) } });
        await notify(db, 'mirrorVersion', `${LIVE.model}/${LIVE.version}`);
        const r = await result;
        if (r === null) throw new Error(`event ${e}: its row did not show the new bytes within 30 s`);
        if ('raced' in r) {
          if (++raced > EVENTS) throw new Error('every event raced the page’s own re-read; see mirror-page.tsx');
          continue;
        }
        records.push(r);
      }
    });
    await page.evaluate('window.scrollTo(0, 0)');
    await sleep(500);
    // The page's main thread in Chromium's own trace while it scrolls: the CPU its tasks took (thread time), which
    // another process on these cores does not inflate the way it does the frames' intervals.
    if (!traceDir) {
      await browser.startTracing(page, {
        categories: ['disabled-by-default-devtools.timeline', ...(showLayers ? [LAYERS] : [])],
      });
    }
    const scroll = await profile(
      browser,
      page,
      cdp,
      'scroll',
      n,
      () =>
        page.evaluate('window.__live.scroll(2000, 120)') as Promise<{
          frames: number[];
          distance: number;
          start: number;
          end: number;
          heightChanges: number;
        }>,
    );
    const trace = traceDir ? undefined : await browser.stopTracing();
    const mainThread = trace && mainThreadTime(trace);
    if (trace && showLayers) printLayers(trace, n);
    await sleep(200);
    const longTasks = (await page.evaluate('window.__live.longTasks')) as [number, number][];
    const events = records.map((r) => {
      const deferred = r.commit > r.taskEnd;
      const scriptMs = (deferred ? r.commit : r.taskEnd) - r.t0;
      const renderMs = r.done - r.raf;
      return {
        workMs: scriptMs + renderMs,
        scriptMs,
        renderMs,
        shownMs: r.done - r.t0,
        groups: r.groups,
        longMs: longIn(longTasks, r.t0, r.done),
        deferred,
      };
    });
    const sorted = [...scroll.frames].sort((x, y) => x - y);
    const seconds = scroll.frames.reduce((s, d) => s + d, 0) / 1000;
    const frozen = await frozenScroll(browser, page);
    await context.close();
    return {
      firstRowMs: b.firstRowAt - b.dataAt,
      paintedMs: b.paintedAt - b.dataAt,
      domNodes,
      heapMiB,
      events,
      fps: scroll.frames.length / seconds,
      longestFrameMs: sorted.at(-1) ?? 0,
      p95FrameMs: sorted[Math.floor(sorted.length * 0.95)] ?? 0,
      pxPerFrame: scroll.distance / Math.max(1, scroll.frames.length),
      scrollLongMs: longIn(longTasks, scroll.start, scroll.end),
      heightChanges: scroll.heightChanges,
      scrollCpuMsPerFrame: mainThread ? mainThread.cpuMs / Math.max(1, scroll.frames.length) : Number.NaN,
      scrollBusyMsPerFrame: mainThread ? mainThread.wallMs / Math.max(1, scroll.frames.length) : Number.NaN,
      scrollTilesPerFrame: mainThread ? mainThread.tiles / Math.max(1, scroll.frames.length) : Number.NaN,
      frozenFps: frozen.fps,
      frozenTilesPerFrame: frozen.tilesPerFrame,
    };
  } finally {
    await browser.close();
  }
}

/** A process that keeps a core busy as long as it lives, at the browser's own priority, as a build beside it would. */
function hog(): ChildProcess {
  const child = spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' });
  child.unref();
  return child;
}

const samples: Record<number, Sample[]> = { [BASELINE]: [], [VERSIONS]: [] };
const hogs = Array.from({ length: HOGS }, hog);
try {
  for (let r = 0; r < ROUNDS; r++) {
    // Alternating which size goes first, so neither always meets a machine in the same state.
    for (const n of r % 2 === 0 ? [BASELINE, VERSIONS] : [VERSIONS, BASELINE]) samples[n]?.push(await measure(n));
  }
} finally {
  for (const h of hogs) h.kill('SIGKILL');
  await app.stop();
  await fs.rm(root, { recursive: true, force: true });
}

const quantile = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) * q)] ?? 0;
const median = (xs: number[]) => quantile(xs, 0.5);
const spread = (xs: number[], digits = 0) => `${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)}`;
console.log(
  `The Mirror page in Chromium (${path.relative(process.cwd(), dist) || dist}), ${VERSIONS} versions against ${BASELINE}, ${ROUNDS} interleaved rounds, ${EVENTS} live events each, ${os.cpus().length} cores, ${HOGS} CPU hog${HOGS === 1 ? '' : 's'} beside the browser, load average ${os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(' ')}`,
);
// Per sample a number (its median where it has many), then the median of those and their spread over the rounds.
type Line = [label: string, of: (s: Sample) => number, unit: string, digits?: number];
const ofEvents =
  (f: (e: Event) => number, q = 0.5) =>
  (s: Sample) =>
    quantile(s.events.map(f), q);
const lines: Line[] = [
  ['first row, after the data', (s) => s.firstRowMs, 'ms'],
  ['painted, after the data', (s) => s.paintedMs, 'ms'],
  ['DOM nodes', (s) => s.domNodes, ''],
  ['JS heap', (s) => s.heapMiB, 'MiB'],
  ['live event: main-thread work, median', ofEvents((e) => e.workMs), 'ms', 1],
  ['live event: main-thread work, p95', ofEvents((e) => e.workMs, 0.95), 'ms', 1],
  ['  of it script (urql, React), median', ofEvents((e) => e.scriptMs), 'ms', 1],
  ['  of it the frame (style, layout, paint)', ofEvents((e) => e.renderMs), 'ms', 1],
  ['live event: message to its frame, median', ofEvents((e) => e.shownMs), 'ms', 1],
  ['live event: row groups changed, most', (s) => Math.max(...s.events.map((e) => e.groups)), ''],
  ['live events: long-task time, all', (s) => s.events.reduce((t, e) => t + e.longMs, 0), 'ms'],
  ['scrolling: frames per second', (s) => s.fps, 'fps'],
  ['scrolling: p95 frame', (s) => s.p95FrameMs, 'ms', 1],
  ['scrolling: longest frame', (s) => s.longestFrameMs, 'ms', 1],
  ['scrolling: px per frame (120 asked)', (s) => s.pxPerFrame, 'px'],
  ['scrolling: long-task time in 2 s', (s) => s.scrollLongMs, 'ms'],
  ['scrolling: list height changes in 2 s', (s) => s.heightChanges, ''],
  ['scrolling: main thread CPU per frame', (s) => s.scrollCpuMsPerFrame, 'ms', 1],
  ['scrolling: main thread busy per frame', (s) => s.scrollBusyMsPerFrame, 'ms', 1],
  ['scrolling: tiles rastered per frame', (s) => s.scrollTilesPerFrame, '', 1],
  ['every row, frozen, scrolling: frames/s', (s) => s.frozenFps, 'fps'],
  ['every row, frozen, scrolling: tiles/frame', (s) => s.frozenTilesPerFrame, '', 1],
];
const cell = (xs: number[], unit: string, digits: number) =>
  `${median(xs).toFixed(digits)}${unit ? ` ${unit}` : ''} (${spread(xs, digits)})`;
console.log(`  ${''.padEnd(42)}${`${BASELINE} versions`.padEnd(26)}${`${VERSIONS} versions`.padEnd(26)}ratio`);
for (const [label, of, unit, digits = 0] of lines) {
  const base = (samples[BASELINE] ?? []).map(of);
  const big = (samples[VERSIONS] ?? []).map(of);
  const ratio = median(base) > 0 ? `${(median(big) / median(base)).toFixed(2)}×` : '—';
  console.log(
    `  ${label.padEnd(42)}${cell(base, unit, digits).padEnd(26)}${cell(big, unit, digits).padEnd(26)}${ratio}`,
  );
}
const deferred = Object.values(samples)
  .flat()
  .flatMap((s) => s.events)
  .filter((e) => e.deferred).length;
if (deferred)
  console.log(`  (${deferred} events committed after their message's task: counted to the commit, waits and all)`);
