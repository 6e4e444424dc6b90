import { useSyncExternalStore } from 'react';
import { type Client, type CombinedError, useClient } from 'urql';
import { uncachedClient } from '../../graphql/client';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { MirrorTable_FamilyFragment } from './mirror-table';
import type { MirrorListingUpdates } from './mirror-updates';
import { type VersionRow_Version, VersionRow_VersionFragment } from './version-row';

// The Mirror page keeps its listing here, not in graphcache. At 5000 versions graphcache spent most of the first
// load normalising every version and its files, and most of each live event reading the whole listing back out of
// its store. Here the listing is the server's answer as it came, and an event replaces one version in its family:
// every other family keeps its arrays and every other row its object, so the table's memoised rows stay as they are.

export const MirrorPage_MirrorQuery = graphql(
  `
  query MirrorPage_Mirror {
    mirror {
      baseUrl
      fetching
      present
      failed
      diskFreeBytes
      bucket
      bucketQuotaBytes
      families {
        ...MirrorTable_Family
      }
    }
  }
`,
  [MirrorTable_FamilyFragment],
);

export type MirrorPage_Mirror = ResultOf<typeof MirrorPage_MirrorQuery>['mirror'];

/** Every version that changes, whole: it replaces its row. One the listing does not hold yet makes it read again. */
export const MirrorPage_ChangedSubscription = graphql(
  `
  subscription MirrorPage_Changed {
    mirrorChanged {
      ...VersionRow_Version
    }
  }
`,
  [VersionRow_VersionFragment],
);

/** One version read again by itself, to replace its row. */
export const MirrorPage_VersionQuery = graphql(
  `
  query MirrorPage_Version($model: String!, $version: String!) {
    mirrorVersion(model: $model, version: $version) {
      ...VersionRow_Version
    }
  }
`,
  [VersionRow_VersionFragment],
);

/**
 * The listing with `version` in place of the one of the same id, or null when no family holds it (the server groups
 * versions into families: a new one is not placed by guessing its family here, the listing is read again instead).
 * A version already as it is listed (the same object) changes nothing: the same listing comes back.
 */
export function placeVersion(mirror: MirrorPage_Mirror, version: VersionRow_Version): MirrorPage_Mirror | null {
  for (const [familyIndex, family] of mirror.families.entries()) {
    const at = family.versions.findIndex((listed) => listed.id === version.id);
    if (at < 0) continue;
    if (family.versions[at] === version) return mirror;
    const versions = family.versions.slice();
    versions[at] = version;
    const families = mirror.families.slice();
    families[familyIndex] = { ...family, versions };
    return { ...mirror, families };
  }
  return null;
}

type ListingState = { mirror?: MirrorPage_Mirror; fetching: boolean; error?: CombinedError };

/**
 * The listing of one client, kept while the console runs: a page opened again shows the last listing at once and
 * reads it again behind it, as graphcache's cache-and-network did. Live while a page watches it: its
 * `mirrorChanged` events replace their version's row.
 */
class MirrorListing {
  // Fetching from the start: the first page to watch it reads it.
  private state: ListingState = { fetching: true };
  private readonly watchers = new Set<() => void>();
  private live: { unsubscribe: () => void } | undefined;
  private reading = false;
  // A read asked for while one is on its way: that answer may predate what asked, so one more follows it.
  private readAgain = false;

  constructor(private readonly plain: Client) {}

  readonly snapshot = () => this.state;

  readonly watch = (onChange: () => void) => {
    this.watchers.add(onChange);
    if (this.watchers.size === 1) {
      this.live = this.plain.subscription(MirrorPage_ChangedSubscription, {}).subscribe((result) => {
        const version = result.data?.mirrorChanged;
        if (version) this.put(version);
      });
      // Downloads went on while nobody looked: every visit reads the listing again.
      this.read();
    }
    return () => {
      this.watchers.delete(onChange);
      if (this.watchers.size > 0) return;
      this.live?.unsubscribe();
      this.live = undefined;
    };
  };

  private set(next: Partial<ListingState>) {
    this.state = { ...this.state, ...next };
    for (const onChange of this.watchers) onChange();
  }

  readonly read = () => {
    if (this.reading) {
      this.readAgain = true;
      return;
    }
    this.reading = true;
    if (!this.state.fetching) this.set({ fetching: true });
    void this.plain
      .query(MirrorPage_MirrorQuery, {}, { requestPolicy: 'network-only' })
      .toPromise()
      .then((result) => {
        this.reading = false;
        this.set({ mirror: result.data?.mirror ?? this.state.mirror, fetching: false, error: result.error });
        if (this.readAgain) {
          this.readAgain = false;
          this.read();
        }
      });
  };

  readonly put = (version: VersionRow_Version) => {
    const mirror = this.state.mirror;
    // Not read yet: the listing on its way holds it.
    if (!mirror) return;
    const next = placeVersion(mirror, version);
    // A tombstone of a version never listed here changes nothing; a new version is placed by the server.
    if (next === null) {
      if (!version.removed) this.read();
      return;
    }
    if (next !== mirror) this.set({ mirror: next });
  };

  readonly drop = (id: string) => {
    const listed = this.state.mirror?.families.flatMap((f) => f.versions).find((v) => v.id === id);
    if (listed && !listed.removed) this.put({ ...listed, removed: true });
  };

  readonly reread = (model: string, version: string) => {
    void this.plain
      .query(MirrorPage_VersionQuery, { model, version }, { requestPolicy: 'network-only' })
      .toPromise()
      .then((result) => {
        const found = result.data?.mirrorVersion;
        if (found) this.put(found);
      });
  };

  readonly updates: MirrorListingUpdates = { put: this.put, drop: this.drop, reread: this.reread };
}

const listings = new WeakMap<Client, MirrorListing>();

/**
 * The listing, read with the client's twin that has no normalised cache (graphql/client.ts), and followed live.
 * `read` reads it all again (after a reconnect, when the counts no longer add up).
 */
export function useMirrorListing() {
  const client = useClient();
  let listing = listings.get(client);
  if (!listing) {
    listing = new MirrorListing(uncachedClient(client));
    listings.set(client, listing);
  }
  const state = useSyncExternalStore(listing.watch, listing.snapshot, listing.snapshot);
  return { ...state, read: listing.read, updates: listing.updates };
}
