import { Fragment } from 'react';
import type { MirrorVersionState, ModelMode } from '../../graphql/types';

// Small pieces the mirror's components share.

const stateClass: Record<MirrorVersionState, string> = {
  QUEUED: 'arriving',
  FETCHING: 'arriving',
  VERIFYING: 'arriving',
  PRESENT: 'ok',
  FAILED: 'bad',
  CANCELLED: 'muted',
  PAUSED: 'muted',
};

/** A version's or a file's state, in words: "fetching", "present", "failed". */
export function stateBadge(state: MirrorVersionState) {
  return <span className={`badge ${stateClass[state] ?? ''}`}>{state.toLowerCase()}</span>;
}

/** A URL that wraps after a '/' when it must wrap, rather than in the middle of a name. */
export function BreakableUrl({ url }: { url: string }) {
  const parts = url.split(/(?<=\/)(?!\/)/);
  return (
    <>
      {parts.map((part, i) => (
        // A text and a <wbr> each, no element around them: a row scrolled into view makes these nodes.
        // biome-ignore lint/suspicious/noArrayIndexKey: the parts of one fixed string, in order.
        <Fragment key={i}>
          {part}
          {i < parts.length - 1 ? <wbr /> : null}
        </Fragment>
      ))}
    </>
  );
}

/** How a catalog model runs, in words: "used by plain-model (always)". */
export const modeWords: Record<ModelMode, string> = { ALWAYS: 'always', ON_DEMAND: 'on demand', STOPPED: 'stopped' };

/** Whether a present file (or every file of a version) was checked against a published sha256; `title` says how. */
export function VerifiedBadge({ verified, title }: { verified: boolean; title: string }) {
  return (
    <span className={verified ? 'badge ok' : 'badge warn'} title={title}>
      {verified ? 'verified' : 'unverified'}
    </span>
  );
}
