import { useEffect, useId, useMemo, useRef, useState, useSyncExternalStore } from 'react';
import { gql, useQuery, useSubscription } from 'urql';
import { type LiveState, live } from '../../graphql/live';
import type { Bytes } from '../../graphql/types';
import { arrivingStates } from '../../graphql/types';
import { useRefetchOnReconnect } from '../../graphql/use-reconnect';
import { formatBytes } from '../../lib/format';
import { CopyButton } from '../common/copy-button';
import { describeError } from '../common/form-error';
import { PageHeader } from '../common/page';
import type { ExplorerNavigate, ExplorerSearch } from '../registry/explorer-search';
import { RegistryExplorer } from '../registry/registry-explorer';
import { FetchForm } from './fetch-form';
import { BreakableUrl } from './mirror-parts';
import { bytesOf, MirrorTable, type MirrorTable_Family, MirrorTable_FamilyFragment } from './mirror-table';
import { type VersionRow_Version, VersionRow_VersionFragment } from './version-row';

export type MirrorPage_Mirror = {
  baseUrl: string;
  fetching: number;
  present: number;
  failed: number;
  diskFreeBytes: Bytes;
  families: MirrorTable_Family[];
};

export const MirrorPage_MirrorQuery = gql<{ mirror: MirrorPage_Mirror }, Record<string, never>>`
  query MirrorPage_Mirror {
    mirror {
      baseUrl
      fetching
      present
      failed
      diskFreeBytes
      families {
        ...MirrorTable_Family
      }
    }
  }
  ${MirrorTable_FamilyFragment}
`;

/**
 * Every version that changes, whole: graphcache updates its row by id. A version the listing does not hold yet
 * makes graphcache's updater (graphql/cache.ts) read the listing again.
 */
export const MirrorPage_ChangedSubscription = gql<{ mirrorChanged: VersionRow_Version }>`
  subscription MirrorPage_Changed {
    mirrorChanged {
      ...VersionRow_Version
    }
  }
  ${VersionRow_VersionFragment}
`;

const liveText: Record<LiveState, string> = {
  connecting: 'Connecting for live updates…',
  live: 'Live: rows follow their downloads as bytes arrive.',
  reconnecting: 'Reconnecting: the list is re-read when the connection is back.',
  stopped: 'Live updates stopped: the server refused the connection. Sign in again to resume them.',
};

export function MirrorPage({
  canChange,
  fetchOpen,
  onFetchOpenChange,
  registrySearch,
  onRegistrySearchChange,
  serve: serveControlled,
  onServeChange,
}: {
  canChange: boolean;
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
  const [{ data, fetching, error }, refetch] = useQuery({
    query: MirrorPage_MirrorQuery,
    // Re-read on every visit: downloads went on while the page was closed.
    requestPolicy: 'cache-and-network',
  });
  useSubscription({ query: MirrorPage_ChangedSubscription });
  const liveState = useSyncExternalStore(live.subscribe, live.get, live.get);
  useRefetchOnReconnect(refetch);
  const anyArriving = (data?.mirror.families ?? []).some((f) =>
    f.versions.some((v) => !v.removed && arrivingStates.includes(v.state)),
  );
  useEffect(() => {
    if (!anyArriving) return;
    // A listing read while a small file finishes can land after the event saying it is done, and no event follows
    // it; while anything is arriving, the listing is read again now and then so every row ends where the server is.
    const t = setInterval(() => refetch({ requestPolicy: 'network-only' }), 5000);
    return () => clearInterval(t);
  }, [anyArriving, refetch]);

  const [localOpen, setLocalOpen] = useState(false);
  const [localServe, setLocalServe] = useState<string>();
  const serve = onServeChange ? serveControlled : localServe;
  const setServe = onServeChange ?? setLocalServe;
  const formOpen = fetchOpen ?? localOpen;
  const setFormOpen = onFetchOpenChange ?? setLocalOpen;
  const formTitleId = useId();
  const registryTitleId = useId();

  const mirror = data?.mirror;
  // A removed version's last event says `removed: true`: it leaves the view at once.
  const families = useMemo(
    () =>
      (mirror?.families ?? [])
        .map((f) => ({ ...f, versions: f.versions.filter((v) => !v.removed) }))
        .filter((f) => f.versions.length > 0),
    [mirror],
  );
  useTotalsFollowRows(mirror, fetching, () => refetch({ requestPolicy: 'network-only' }));

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
    <section>
      <PageHeader title="Mirror">
        The model files this Hangar keeps, by model and version, with what is arriving and what failed. Nodes load
        weights from here.
      </PageHeader>
      {mirror ? <MirrorFacts mirror={mirror} usedBytes={bytesOf(families.flatMap((f) => f.versions))} /> : null}
      <div className="toolbar">
        <p className="live-state" aria-live="polite">
          <span className={`dot ${liveState === 'live' ? 'ok' : 'idle'}`} aria-hidden="true" />
          {liveText[liveState]}
        </p>
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
      {error ? (
        <p role="alert" className="form-error">
          {describeError(error)}
        </p>
      ) : null}
      {empty ? (
        <p className="empty">
          The mirror holds nothing yet.{' '}
          {canChange
            ? 'Give a model, a version and the URLs of its files below, or get a model from the registry further down: Hangar fetches the files, checks their sha256 and serves them to the nodes.'
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
        <MirrorTable families={families} canChange={canChange} serve={serve} onServeChange={setServe} />
      ) : null}
      {!mirror && fetching ? <p className="muted">Loading…</p> : null}
      {/* A set fetched from here joins the listing above: graphcache's updater reads it again (graphql/cache.ts). */}
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
    </section>
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
      <div>
        <dt>Disk</dt>
        <dd>
          {formatBytes(usedBytes)} used <span className="muted">· {formatBytes(mirror.diskFreeBytes)} free</span>
        </dd>
      </div>
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
function useTotalsFollowRows(mirror: MirrorPage_Mirror | undefined, fetching: boolean, reread: () => void) {
  const versions = mirror?.families.flatMap((f) => f.versions) ?? [];
  const shown = versions.filter((v) => !v.removed);
  const count = (test: (v: VersionRow_Version) => boolean) => shown.filter(test).length;
  const behind =
    mirror !== undefined &&
    (shown.length !== versions.length ||
      count((v) => arrivingStates.includes(v.state)) !== mirror.fetching ||
      count((v) => v.state === 'PRESENT') !== mirror.present ||
      count((v) => v.state === 'FAILED') !== mirror.failed);
  const change = versions.map((v) => `${v.id}:${v.removed ? 'removed' : v.state}`).join(' ');
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
