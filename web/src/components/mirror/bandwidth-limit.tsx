import { useId, useState } from 'react';
import { useMutation, useQuery } from 'urql';
import { graphql } from '../../graphql/graphql';
import { isRefusal } from '../../graphql/types';
import { describeError, FormError_RefusalFragment } from '../common/form-error';
import { InlineProblem } from '../common/form-parts';

export const BandwidthLimit_Query = graphql(`
  query BandwidthLimit {
    mirror {
      bandwidthLimit
    }
  }
`);

export const BandwidthLimit_SetMutation = graphql(
  `
  mutation BandwidthLimit_Set($bytesPerSecond: Bytes) {
    setMirrorBandwidth(bytesPerSecond: $bytesPerSecond) {
      __typename
      ... on MirrorBandwidth {
        bytesPerSecond
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

const MB = 1_000_000;

/** In the unit the form asks for (MB/s, decimal, as HANGAR_MIRROR_BANDWIDTH=50MB/s reads). */
function perSecond(bytes: number) {
  return bytes >= MB ? `${Number((bytes / MB).toFixed(2))} MB/s` : `${Math.round(bytes / 1000)} kB/s`;
}

/**
 * The limit every download of the mirror shares, shown beside the listing and changeable there. It holds for this
 * server process until it restarts: HANGAR_MIRROR_BANDWIDTH is where a lasting limit is set, and the form says so.
 */
export function BandwidthLimit({ canChange }: { canChange: boolean }) {
  const [{ data }, reread] = useQuery({ query: BandwidthLimit_Query });
  const [state, set] = useMutation(BandwidthLimit_SetMutation);
  const [editing, setEditing] = useState(false);
  const [value, setValue] = useState('');
  const [problem, setProblem] = useState<string>();
  const id = useId();
  const limit = data?.mirror.bandwidthLimit ?? null;

  const apply = async (bytesPerSecond: number | null) => {
    setProblem(undefined);
    const r = await set({ bytesPerSecond });
    const answer = r.data?.setMirrorBandwidth;
    if (r.error) setProblem(describeError(r.error));
    else if (isRefusal(answer)) setProblem(answer.message);
    else {
      setEditing(false);
      reread({ requestPolicy: 'network-only' });
    }
  };

  return (
    <div className="bandwidth-limit">
      <span>
        Download limit: <strong>{limit === null ? 'none' : perSecond(limit)}</strong>
      </span>
      {canChange && !editing ? (
        <button
          type="button"
          className="button small"
          onClick={() => {
            setValue(limit === null ? '' : String(limit / MB));
            setEditing(true);
          }}
        >
          Change
        </button>
      ) : null}
      {editing ? (
        <form
          className="bandwidth-form"
          aria-label="Download limit"
          onSubmit={(e) => {
            e.preventDefault();
            const n = Number(value);
            if (!value.trim() || !Number.isFinite(n) || n <= 0) {
              setProblem('a number of MB per second, more than 0 (or No limit)');
              return;
            }
            void apply(Math.round(n * MB));
          }}
        >
          <label htmlFor={id}>MB/s</label>
          <input
            id={id}
            inputMode="decimal"
            size={6}
            value={value}
            aria-describedby={`${id}-hint`}
            onChange={(e) => setValue(e.target.value)}
          />
          <button type="submit" className="button small primary" disabled={state.fetching}>
            Set
          </button>
          <button type="button" className="button small" disabled={state.fetching} onClick={() => apply(null)}>
            No limit
          </button>
          <button type="button" className="button small" onClick={() => setEditing(false)}>
            Close
          </button>
          <span id={`${id}-hint`} className="hint">
            Shared by every download of this server until it restarts; HANGAR_MIRROR_BANDWIDTH sets it for good.
          </span>
        </form>
      ) : null}
      <InlineProblem problem={problem} inline={false} />
    </div>
  );
}
