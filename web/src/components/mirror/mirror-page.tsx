import { useCallback, useEffect, useId, useMemo, useRef, useState, useSyncExternalStore } from 'react';
import { type LiveState, live } from '../../graphql/live';
import type { Bytes } from '../../graphql/types';
import { useRefetchOnReconnect } from '../../graphql/use-reconnect';
import { formatBytes } from '../../lib/format';
import { CopyButton } from '../common/copy-button';
import { FormError } from '../common/form-error';
import { PageHeader } from '../common/page';
import type { ExplorerNavigate, ExplorerSearch } from '../registry/explorer-search';
import { RegistryExplorer } from '../registry/registry-explorer';
import { BandwidthLimit } from './bandwidth-limit';
import { FetchForm } from './fetch-form';
import { type MirrorPage_Mirror, useMirrorListing } from './mirror-listing';
import { BreakableUrl } from './mirror-parts';
import {
  type MirrorFilter,
  MirrorTable,
  type MirrorTotals,
  mirrorItems,
  mirrorTotals,
  type StateFilter,
  shownFamilies,
  stateFilters,
} from './mirror-table';
import { MirrorListingContext } from './mirror-updates';

// The listing's documents live with the listing; exported here too, as the page's own.
export { MirrorPage_ChangedSubscription, MirrorPage_MirrorQuery, MirrorPage_VersionQuery } from './mirror-listing';

// The most arriving versions read again each time: more than this are queued ones, which events do follow.
const REREAD_AT_MOST = 20;

const liveText: Record<LiveState, string> = {
  connecting: 'Connecting for live updates…',
  live: 'Live: rows follow their downloads as bytes arrive.',
  reconnecting: 'Reconnecting: the list is re-read when the connection is back.',
  stopped: 'Live updates stopped: the server refused the connection. Sign in again to resume them.',
};

export function MirrorPage({
  canChange,
  registryOn = true,
  fetchOpen,
  onFetchOpenChange,
  registrySearch,
  onRegistrySearchChange,
  serve: serveControlled,
  onServeChange,
  filter: filterControlled,
  onFilterChange,
}: {
  canChange: boolean;
  /** Whether the registry explorer is on (HANGAR_HUB_URL): off, the page says nothing of a registry. */
  registryOn?: boolean;
  /** What the listing is narrowed to (part of a name, a state); kept in the URL by the route. */
  filter?: MirrorFilter;
  onFilterChange?: (filter: MirrorFilter) => void;
  /** The version ("model/version") whose serve form is open; kept in the URL by the route. */
  serve?: string;
  onServeChange?: (serve: string | undefined) => void;
  /** Whether the fetch form is open; kept in the URL by the route, so it survives a reload. */
  fetchOpen?: boolean;
  onFetchOpenChange?: (open: boolean) => void;
  /** The registry explorer's search and open repository, kept in the URL by the route too. */
  registrySearch?: ExplorerSearch;
  onRegistrySearchChange?: ExplorerNavigate;
}) {
  // Read on every visit (downloads went on while the page was closed), and followed live.
  const { mirror, fetching, error, read, updates } = useMirrorListing();
  const liveState = useSyncExternalStore(live.subscribe, live.get, live.get);
  useRefetchOnReconnect(read);
  // Added up by family and kept by family: a live event adds up its own family again, not every version.
  const totals = useMemo(() => mirrorTotals(mirror?.families ?? []), [mirror]);
  const arriving = totals.arrivingNames.slice(0, REREAD_AT_MOST).join('\n');
  useEffect(() => {
    if (!arriving) return;
    // A listing read while a small file finishes can land after the event saying it is done, and no event follows
    // it; while anything is arriving, those versions are read again now and then so every row ends where the server
    // is. Each by itself: the whole listing at 5000 versions is megabytes, every five seconds.
    const t = setInterval(() => {
      for (const key of arriving.split('\n')) {
        const [model = '', version = ''] = key.split('/');
        updates.reread(model, version);
      }
    }, 5000);
    return () => clearInterval(t);
  }, [arriving, updates]);

  const [localOpen, setLocalOpen] = useState(false);
  const [localServe, setLocalServe] = useState<string>();
  const serve = onServeChange ? serveControlled : localServe;
  const setServe = onServeChange ?? setLocalServe;
  const [localFilter, setLocalFilter] = useState<MirrorFilter>({});
  const filter = onFilterChange ? (filterControlled ?? {}) : localFilter;
  const setFilter = onFilterChange ?? setLocalFilter;
  // Folded families are the operator's view of the moment, not worth a place in the URL.
  const [collapsed, setCollapsed] = useState<ReadonlySet<string>>(new Set());
  const toggleFamily = useCallback(
    (name: string) =>
      setCollapsed((was) => {
        const next = new Set(was);
        if (!next.delete(name)) next.add(name);
        return next;
      }),
    [],
  );
  const formOpen = fetchOpen ?? localOpen;
  const setFormOpen = onFetchOpenChange ?? setLocalOpen;
  const formTitleId = useId();
  const registryTitleId = useId();

  const families = useMemo(() => shownFamilies(mirror?.families ?? []), [mirror]);
  // By its parts: the route hands a new filter object on every render.
  const { name: nameFilter, state: stateFilter } = filter;
  const items = useMemo(
    () => mirrorItems(families, { name: nameFilter, state: stateFilter }, collapsed),
    [families, nameFilter, stateFilter, collapsed],
  );
  useTotalsFollowRows(mirror, totals, fetching, read);

  const empty = mirror !== undefined && families.length === 0;
  // An empty mirror has nothing to show but the way to fill it. Opened that way, the form stays open once the
  // first version arrives: it holds the server's answer, and the next fetch is likely to follow.
  const [keptOpen, setKeptOpen] = useState(false);
  if (empty && canChange && !keptOpen) setKeptOpen(true);
  const open = formOpen || keptOpen || empty;
  const toggleForm = () => {
    setKeptOpen(false);
    setFormOpen(!open);
  };
  const showForm = canChange && open;

  return (
    <MirrorListingContext.Provider value={updates}>
      <section>
        <PageHeader title="Mirror">
          The model files this Hangar keeps, by model and version, with what is arriving and what failed. Nodes load
          weights from here.
        </PageHeader>
        {mirror ? <MirrorFacts mirror={mirror} usedBytes={totals.usedBytes} /> : null}
        <div className="toolbar">
          <p className="live-state" aria-live="polite">
            <span className={`dot ${liveState === 'live' ? 'ok' : 'idle'}`} aria-hidden="true" />
            {liveText[liveState]}
          </p>
          <BandwidthLimit canChange={canChange} />
          {canChange && !empty ? (
            <button
              type="button"
              className={`button disclosure${open ? '' : ' primary'}`}
              aria-expanded={open}
              aria-controls="fetch-by-url"
              onClick={toggleForm}
            >
              Fetch by URL
            </button>
          ) : null}
        </div>
        <FormError error={error} />
        {empty ? (
          <p className="empty">
            The mirror holds nothing yet.{' '}
            {canChange
              ? `Give a model, a version and the URLs of its files below${registryOn ? ', or get a model from the registry further down' : ''}: Hangar fetches the files, checks their sha256 and serves them to the nodes.`
              : 'An operator fetches model files into it.'}
          </p>
        ) : null}
        {showForm ? (
          <section id="fetch-by-url" className="panel fetch-panel" aria-labelledby={formTitleId}>
            <h2 id={formTitleId}>Fetch by URL</h2>
            <FetchForm titleId={formTitleId} />
          </section>
        ) : null}
        {mirror && !empty ? (
          <>
            <MirrorFilters filter={filter} onChange={setFilter} />
            {items.length === 0 ? (
              <p className="empty">
                No version matches the filter.{' '}
                <button type="button" className="link-button" onClick={() => setFilter({})}>
                  Show every version
                </button>
              </p>
            ) : (
              <MirrorTable
                items={items}
                canChange={canChange}
                serve={serve}
                onServeChange={setServe}
                onToggleFamily={toggleFamily}
              />
            )}
          </>
        ) : null}
        {!mirror && fetching ? <p className="muted">Loading…</p> : null}
        {/* A set fetched from here joins the listing above: its row reports the answer (mirror-updates.ts). */}
        {registryOn ? (
          <section className="panel registry-panel" aria-labelledby={registryTitleId}>
            <h2 id={registryTitleId} className="registry-title">
              Get from the registry
            </h2>
            <p className="hint">
              Search the model registry and open a repository: each file set is judged against the fleet (will llama.cpp
              load it, how much memory, where it fits) before any download.
            </p>
            <RegistryExplorer canFetch={canChange} search={registrySearch} onSearchChange={onRegistrySearchChange} />
          </section>
        ) : null}
      </section>
    </MirrorListingContext.Provider>
  );
}

/** Narrows the listing: a name (any part of "model/version") and a state. */
function MirrorFilters({ filter, onChange }: { filter: MirrorFilter; onChange: (filter: MirrorFilter) => void }) {
  return (
    <search className="form-row mirror-filters" aria-label="Filter versions">
      <label className="field">
        <span>Name</span>
        <input
          type="search"
          value={filter.name ?? ''}
          placeholder="qwen3, Q4_K_M…"
          onChange={(e) => onChange({ ...filter, name: e.target.value || undefined })}
        />
      </label>
      <label className="field">
        <span>State</span>
        <select
          value={filter.state ?? ''}
          onChange={(e) => onChange({ ...filter, state: (e.target.value || undefined) as StateFilter | undefined })}
        >
          <option value="">every state</option>
          {(Object.keys(stateFilters) as StateFilter[]).map((s) => (
            <option key={s} value={s}>
              {stateFilters[s]}
            </option>
          ))}
        </select>
      </label>
    </search>
  );
}

function MirrorFacts({ mirror, usedBytes }: { mirror: MirrorPage_Mirror; usedBytes: Bytes }) {
  return (
    <dl className="facts" aria-label="The mirror">
      <div>
        <dt>Fetching</dt>
        <dd>{mirror.fetching}</dd>
      </div>
      <div>
        <dt>Present</dt>
        <dd>{mirror.present}</dd>
      </div>
      <div>
        <dt>Failed</dt>
        <dd className={mirror.failed ? 'bad' : undefined}>{mirror.failed}</dd>
      </div>
      {mirror.bucket ? (
        // A bucket has no free space to tell: what the mirror holds there, and the room HANGAR_S3_QUOTA leaves.
        <div>
          <dt>Bucket</dt>
          <dd>
            in bucket <code>{mirror.bucket}</code>: {formatBytes(usedBytes)} held
            {mirror.bucketQuotaBytes != null && (
              <span className="muted">
                {' '}
                · {formatBytes(mirror.diskFreeBytes)} left of the {formatBytes(mirror.bucketQuotaBytes)} quota
              </span>
            )}
          </dd>
        </div>
      ) : (
        <div>
          <dt>Disk</dt>
          <dd>
            {formatBytes(usedBytes)} used <span className="muted">· {formatBytes(mirror.diskFreeBytes)} free</span>
          </dd>
        </div>
      )}
      <div className="grow">
        <dt>Base URL</dt>
        <dd className="url-line">
          <code className="url">
            <BreakableUrl url={mirror.baseUrl} />
          </code>
          <CopyButton text={mirror.baseUrl} label="Copy base URL" />
        </dd>
      </div>
    </dl>
  );
}

/**
 * The counts (and the free disk) are the server's, read with the listing; rows change live. When the rows no longer
 * add up to the counts (a version finished, failed or was removed), the listing is read again: once per change, so
 * a server that counts differently cannot make the page poll.
 */
function useTotalsFollowRows(
  mirror: MirrorPage_Mirror | undefined,
  totals: MirrorTotals,
  fetching: boolean,
  reread: () => void,
) {
  const behind =
    mirror !== undefined &&
    (totals.removed > 0 ||
      totals.arriving !== mirror.fetching ||
      totals.present !== mirror.present ||
      totals.failed !== mirror.failed);
  // Spelt out only when behind, which a progress event is not: it runs on every event, at thousands of versions.
  const change = behind
    ? (mirror?.families ?? [])
        .flatMap((f) => f.versions)
        .map((v) => `${v.id}:${v.removed ? 'removed' : v.state}`)
        .join(' ')
    : '';
  const asked = useRef<string>(undefined);
  const rereadRef = useRef(reread);
  rereadRef.current = reread;
  useEffect(() => {
    if (!behind || fetching || asked.current === change) return;
    // A moment's wait: one finished download sends a few events in a row.
    const t = setTimeout(() => {
      asked.current = change;
      rereadRef.current();
    }, 250);
    return () => clearTimeout(t);
  }, [behind, fetching, change]);
}
