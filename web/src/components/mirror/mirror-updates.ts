import { createContext, useContext } from 'react';
import type { VersionRow_Version } from './version-row';

// Apart from the listing (mirror-listing.tsx), so the rows and forms that report to it import no query of it.

/** What a view inside the Mirror page tells the listing: a version as an answer has it now, or to read one again. */
export type MirrorListingUpdates = {
  /** A version as a mutation's answer has it (whole): its row shows it now, a new one makes the listing read again. */
  put: (version: VersionRow_Version) => void;
  /** A version gone from the mirror: its row leaves at once. */
  drop: (id: string) => void;
  /** A version whose fields changed elsewhere (its "used by" after a serve): read again from the server. */
  reread: (model: string, version: string) => void;
};

const nothing: MirrorListingUpdates = { put: () => {}, drop: () => {}, reread: () => {} };

/** Outside the Mirror page (a registry page alone), answers change no listing. */
export const MirrorListingContext = createContext<MirrorListingUpdates>(nothing);
export const useMirrorListingUpdates = () => useContext(MirrorListingContext);
