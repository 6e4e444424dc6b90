import { measureElement, useWindowVirtualizer, type Virtualizer } from '@tanstack/react-virtual';
import { memo, type RefObject, useCallback, useLayoutEffect, useRef, useState } from 'react';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { Bytes } from '../../graphql/types';
import { arrivingStates } from '../../graphql/types';
import { formatBytes } from '../../lib/format';
import { ACTIONS_COLUMN, DataTable } from '../common/data-table';
import { useHeldHeight } from './held-height';
import { createListScrolling, ListScrollingContext } from './scroll-settle';
import { createSizeGuesses } from './size-guesses';
import { COLUMNS, VersionRow, type VersionRow_Version, VersionRow_VersionFragment } from './version-row';

export const MirrorTable_FamilyFragment = graphql(
  `
  fragment MirrorTable_Family on MirrorFamily {
    name
    modelCount
    versions {
      ...VersionRow_Version
    }
  }
`,
  [VersionRow_VersionFragment],
);

export type MirrorTable_Family = ResultOf<typeof MirrorTable_FamilyFragment>;

/** What the operator narrows the listing to: part of a name, and a state (or "in use"). */
export type MirrorFilter = { name?: string; state?: StateFilter };

/** The state select's choices, in words. "arriving" is every state of a download under way. */
export const stateFilters = {
  arriving: 'arriving',
  failed: 'failed',
  present: 'present',
  cancelled: 'cancelled',
  'in-use': 'in use',
} as const;
export type StateFilter = keyof typeof stateFilters;

function matches(v: VersionRow_Version, filter: MirrorFilter, name: string) {
  if (name && !`${v.model}/${v.version}`.toLowerCase().includes(name)) return false;
  switch (filter.state) {
    case undefined:
      return true;
    case 'arriving':
      return arrivingStates.includes(v.state);
    case 'in-use':
      return v.usedBy.length > 0;
    default:
      return v.state.toLowerCase() === filter.state;
  }
}

/** What a family's heading says of it: always the whole family, whatever the filter shows of it. */
export type FamilySummary = {
  name: string;
  modelCount: number;
  versionCount: number;
  bytes: Bytes;
  fetching: number;
  failed: number;
  inUse: number;
  /** How many of its versions the filter shows. */
  shown: number;
  collapsed: boolean;
};

export type MirrorItem =
  | { kind: 'family'; key: string; family: FamilySummary }
  | { kind: 'version'; key: string; version: VersionRow_Version };

// Plain code-unit order on names: stable, and cheap enough to run on every live event at 5000 versions.
const byText = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
const byName = (a: VersionRow_Version, b: VersionRow_Version) =>
  byText(a.model, b.model) || byText(a.version, b.version);

/**
 * The rows to show, in order: every family under a heading of its own (a family of one model too: without one its
 * rows read as the family above, and tiny-llama sat under "qwen"), families by name and versions by model and
 * version. Only names order them, never state or bytes, so a row stays where it is while its download moves on.
 * A collapsed family keeps its heading; a family the filter leaves empty is not shown.
 */
export function mirrorItems(
  families: MirrorTable_Family[],
  filter: MirrorFilter,
  collapsed: ReadonlySet<string>,
): MirrorItem[] {
  const name = filter.name?.trim().toLowerCase() ?? '';
  const filtering = name !== '' || filter.state !== undefined;
  const filterKey = `${name}\n${filter.state ?? ''}`;
  const items: MirrorItem[] = [];
  for (const family of [...families].sort((a, b) => byText(a.name, b.name))) {
    const { shown, versionItems, counts } = familyRows(family.versions, filterKey, (v) => matches(v, filter, name));
    if (filtering && shown.length === 0) continue;
    const isCollapsed = collapsed.has(family.name);
    const summary: FamilySummary = {
      name: family.name,
      modelCount: family.modelCount,
      versionCount: family.versions.length,
      ...counts,
      shown: shown.length,
      collapsed: isCollapsed,
    };
    items.push({ kind: 'family', key: `family:${family.name}`, family: summary });
    if (!isCollapsed) for (const item of versionItems) items.push(item);
  }
  return items;
}

type FamilyRows = {
  filterKey: string;
  shown: VersionRow_Version[];
  /** The shown versions as items, made once: a live event does not make 5000 new ones. */
  versionItems: MirrorItem[];
  counts: Pick<FamilySummary, 'bytes' | 'fetching' | 'failed' | 'inUse'>;
};

// A live event changes one version: the listing (mirror-listing.tsx) keeps the same array for every other family, whose rows are then
// not filtered, sorted and counted again.
const rowsOf = new WeakMap<VersionRow_Version[], FamilyRows>();

function familyRows(versions: VersionRow_Version[], filterKey: string, test: (v: VersionRow_Version) => boolean) {
  const kept = rowsOf.get(versions);
  if (kept?.filterKey === filterKey) return kept;
  const counts = { bytes: 0, fetching: 0, failed: 0, inUse: 0 };
  for (const v of versions) {
    counts.bytes += v.bytesDone;
    if (arrivingStates.includes(v.state)) counts.fetching++;
    if (v.state === 'FAILED') counts.failed++;
    if (v.usedBy.length > 0) counts.inUse++;
  }
  const shown = versions.filter(test).sort(byName);
  const versionItems = shown.map((v): MirrorItem => ({ kind: 'version', key: v.id, version: v }));
  const rows = { filterKey, shown, versionItems, counts };
  rowsOf.set(versions, rows);
  return rows;
}

const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** Rows that hold the same parts are about the same height: a family's heading, a version in use (its chips), one
 * arriving (a bar and a rate), any other. */
type SizeClass = 'family' | 'used' | 'arriving' | 'version';

function sizeClass(item: MirrorItem): SizeClass {
  if (item.kind === 'family') return 'family';
  if (arrivingStates.includes(item.version.state)) return 'arriving';
  return item.version.usedBy.length > 0 ? 'used' : 'version';
}

/**
 * The listing, virtualised: only the rows near the window's view are in the page (5000 rows all rendered took
 * 3.3 s and 250,000 DOM nodes), each version in a row group of its own that is measured as it renders, so a row
 * opened to show its files or a serve form pushes the ones below it down. Rows are memoised: a live event about
 * one version re-renders that version's row and nothing else.
 *
 * Each row group is placed where react-virtual says it starts, out of the table's flow (mirror.css), in a table
 * as tall as every row would make it. Row groups in the table's flow, between spacers, made every row that came
 * or went while scrolling lay out and paint the whole table again: 48 fps at 5000 versions, against 59–60 placed.
 */
export function MirrorTable({
  items,
  canChange,
  serve,
  onServeChange,
  onToggleFamily,
}: {
  items: MirrorItem[];
  canChange: boolean;
  /** The version ("model/version") whose serve form is open. */
  serve?: string;
  onServeChange?: (serve: string | undefined) => void;
  onToggleFamily: (name: string) => void;
}) {
  const headRef = useRef<HTMLTableSectionElement>(null);
  const { top: scrollMargin, head } = useListTop(headRef);
  // A row not rendered yet is guessed at what the last closed one of its class measured (at 1280 px a version about
  // 101 px, its URL on three lines; one in use taller by its chips; a heading 40 px). Each row that measures other
  // than its guess makes react-virtual work out the place of every row below it again (5000 of them), moves the
  // rows in view and repaints them: one guess for every version missed each row in use, which came in nearly every
  // frame when scrolling through a family in use. A row opened to its files or a form is no guess for the others.
  // While the list moves the guesses stay (size-guesses.ts says why).
  const [guesses] = useState(() =>
    createSizeGuesses<SizeClass>({ family: 40, version: 100, used: 132, arriving: 100 }),
  );
  // The same functions until the items change: react-virtual places every row again when they change.
  const estimateSize = useCallback(
    (i: number) => {
      const item = items[i];
      return guesses.of(item ? sizeClass(item) : 'version');
    },
    [items, guesses],
  );
  const getItemKey = useCallback((i: number) => items[i]?.key ?? i, [items]);
  const measureRow = useCallback(
    (el: Element, entry: ResizeObserverEntry | undefined, v: Virtualizer<Window, Element>) => {
      const size = measureElement(el, entry, v);
      const item = items[v.indexFromElement(el)];
      if (item && size > 0 && el.childElementCount === 1) guesses.measured(sizeClass(item), size, v.isScrolling);
      return size;
    },
    [items, guesses],
  );
  const virtualizer = useWindowVirtualizer({
    count: items.length,
    estimateSize,
    getItemKey,
    measureElement: measureRow,
    overscan: 6,
    scrollMargin,
  });
  // The row's callback stays the same function across renders, so a memoised row is not re-rendered for it.
  const serveRef = useRef(onServeChange);
  serveRef.current = onServeChange;
  const toggleServe = useCallback((open: boolean, name: string) => serveRef.current?.(open ? name : undefined), []);
  // Rows that come in while the list moves hold their form controls back until it stops (scroll-settle.tsx). Set
  // here, in the render that mounts them; the rows waiting hear that it stopped after the render that says so.
  const [listScrolling] = useState(createListScrolling);
  if (virtualizer.isScrolling) listScrolling.scrolling = true;
  const scrolling = virtualizer.isScrolling;
  useLayoutEffect(() => listScrolling.set(scrolling), [listScrolling, scrolling]);
  useLayoutEffect(() => {
    if (!scrolling) guesses.settled();
  }, [guesses, scrolling]);
  // Not shrunk by the rows' guesses while the list moves (held-height.ts): each change repaints the page behind it.
  const height = useHeldHeight(head + virtualizer.getTotalSize(), scrolling, window.innerHeight);

  return (
    <ListScrollingContext.Provider value={listScrolling}>
      <DataTable
        className="mirror"
        style={{ height }}
        headRef={headRef}
        columns={['Version', 'State', 'Progress', 'Details', ACTIONS_COLUMN]}
      >
        {virtualizer.getVirtualItems().map((row) => {
          const item = items[row.index];
          if (!item) return null;
          return (
            <tbody
              key={item.key}
              data-index={row.index}
              data-last={row.index === items.length - 1 ? '' : undefined}
              ref={virtualizer.measureElement}
              style={{ transform: `translateY(${head + row.start - scrollMargin}px)` }}
            >
              {item.kind === 'family' ? (
                <FamilyHeading family={item.family} onToggle={onToggleFamily} />
              ) : (
                <VersionRow
                  version={item.version}
                  canChange={canChange}
                  serving={serve === `${item.version.model}/${item.version.version}`}
                  onServingChange={onServeChange ? toggleServe : undefined}
                />
              )}
            </tbody>
          );
        })}
      </DataTable>
    </ListScrollingContext.Provider>
  );
}

/**
 * Where the list's first row is on the page (the virtualiser counts rows from there), and how tall the table's
 * head is (the rows are placed below it). Read again whenever the page changes size, as it does when the fetch
 * form above opens.
 */
function useListTop(head: RefObject<HTMLElement | null>) {
  const [place, setPlace] = useState({ top: 0, head: 0 });
  useLayoutEffect(() => {
    const el = head.current;
    if (!el) return;
    const measure = () => {
      const at = Math.round(el.getBoundingClientRect().bottom + window.scrollY);
      const height = el.offsetHeight;
      setPlace((p) => (p.top === at && p.head === height ? p : { top: at, head: height }));
    };
    measure();
    if (typeof ResizeObserver === 'undefined') return;
    const ro = new ResizeObserver(measure);
    ro.observe(document.body);
    return () => ro.disconnect();
  }, [head]);
  return place;
}

/** A family's heading: what is in it at a glance, and a button that folds its rows away. */
const FamilyHeading = memo(function FamilyHeading({
  family,
  onToggle,
}: {
  family: FamilySummary;
  onToggle: (name: string) => void;
}) {
  const f = family;
  return (
    <tr className="family">
      <th colSpan={COLUMNS} scope="rowgroup">
        <h2>
          <button
            type="button"
            className="family-toggle"
            aria-expanded={!f.collapsed}
            title={f.collapsed ? `Show the versions of ${f.name}` : `Hide the versions of ${f.name}`}
            onClick={() => onToggle(f.name)}
          >
            {f.name}
          </button>
          <span className="family-facts">
            {plural(f.modelCount, 'model')} · {plural(f.versionCount, 'version')} · {formatBytes(f.bytes)}
            {f.shown < f.versionCount ? ` · ${f.shown} shown` : ''}
          </span>
          <span className="family-counts">
            {f.fetching ? <span className="badge arriving">{f.fetching} fetching</span> : null}
            {f.failed ? <span className="badge bad">{f.failed} failed</span> : null}
            {f.inUse ? <span className="badge ok">{f.inUse} in use</span> : null}
          </span>
        </h2>
      </th>
    </tr>
  );
}, sameFamily);

function sameFamily(a: { family: FamilySummary; onToggle: unknown }, b: typeof a) {
  if (a.onToggle !== b.onToggle) return false;
  const x = a.family;
  const y = b.family;
  return (Object.keys(x) as (keyof FamilySummary)[]).every((k) => x[k] === y[k]);
}

/** What the page adds up over the whole listing: its counts, to check against the server's, and the disk used. */
export type MirrorTotals = {
  removed: number;
  arriving: number;
  present: number;
  failed: number;
  /** "model/version" of each arriving version, in the listing's order. */
  arrivingNames: string[];
  /**
   * The server's own definition of the disk used: the bytes received, a present file that several versions hold
   * counted once (they are hard links to one copy), added up from the rows so it never shows less than a row.
   */
  usedBytes: Bytes;
};

type FamilyTally = Omit<MirrorTotals, 'usedBytes'> & {
  /** Bytes counted as they are: every file but a present one with a sha256. */
  plainBytes: number;
  /** A present file's bytes by its sha256, the first seen: another holding the same sha256 is the same copy. */
  held: Map<string, number>;
  /** The same held files give the same text: when no family's changed, the sum across families stands. */
  heldKey: string;
};

// Kept by the family's versions array, which the listing keeps for every family a live event did not touch: an
// event adds up one family again, not 5000 versions.
const tallies = new WeakMap<VersionRow_Version[], FamilyTally>();

function familyTally(versions: VersionRow_Version[]): FamilyTally {
  const kept = tallies.get(versions);
  if (kept) return kept;
  const t: FamilyTally = {
    removed: 0,
    arriving: 0,
    present: 0,
    failed: 0,
    arrivingNames: [],
    plainBytes: 0,
    held: new Map(),
    heldKey: '',
  };
  const keys: string[] = [];
  for (const v of versions) {
    if (v.removed) {
      t.removed++;
      continue;
    }
    if (arrivingStates.includes(v.state)) {
      t.arriving++;
      t.arrivingNames.push(`${v.model}/${v.version}`);
    } else if (v.state === 'PRESENT') t.present++;
    else if (v.state === 'FAILED') t.failed++;
    for (const f of v.files) {
      if (f.state === 'PRESENT' && f.sha256) {
        if (t.held.has(f.sha256)) continue;
        t.held.set(f.sha256, f.bytesDone);
        keys.push(`${f.sha256}:${f.bytesDone}`);
      } else t.plainBytes += f.bytesDone;
    }
  }
  t.heldKey = keys.join(' ');
  tallies.set(versions, t);
  return t;
}

let lastHeld: { keys: string[]; bytes: number } | undefined;

/** The present files' bytes across families, each sha256 once; worked out again only when some family's changed. */
function heldBytes(families: FamilyTally[]): number {
  const keys = families.map((t) => t.heldKey);
  if (lastHeld && lastHeld.keys.length === keys.length && lastHeld.keys.every((k, i) => k === keys[i])) {
    return lastHeld.bytes;
  }
  const seen = new Set<string>();
  let bytes = 0;
  for (const t of families) {
    for (const [sha, n] of t.held) {
      if (seen.has(sha)) continue;
      seen.add(sha);
      bytes += n;
    }
  }
  lastHeld = { keys, bytes };
  return bytes;
}

/** The listing's totals (removed versions counted apart and in nothing else). */
export function mirrorTotals(families: MirrorTable_Family[]): MirrorTotals {
  const each = families.map((f) => familyTally(f.versions));
  const sum = (k: 'removed' | 'arriving' | 'present' | 'failed') => each.reduce((n, t) => n + t[k], 0);
  return {
    removed: sum('removed'),
    arriving: sum('arriving'),
    present: sum('present'),
    failed: sum('failed'),
    arrivingNames: each.flatMap((t) => t.arrivingNames),
    usedBytes: each.reduce((n, t) => n + t.plainBytes, 0) + heldBytes(each),
  };
}

/**
 * The families as shown: a removed version's last event says `removed: true`, and it leaves the view at once. A
 * family without one keeps its identity, so its rows' order is not worked out again.
 */
export function shownFamilies(families: MirrorTable_Family[]): MirrorTable_Family[] {
  return families
    .map((f) => (familyTally(f.versions).removed > 0 ? { ...f, versions: f.versions.filter((v) => !v.removed) } : f))
    .filter((f) => f.versions.length > 0);
}
