import { graphql, type ResultOf } from '../../graphql/graphql';
import { arrivingStates } from '../../graphql/types';
import { formatBytes, shortSha } from '../../lib/format';
import { DataTable } from '../common/data-table';
import { stateBadge, VerifiedBadge } from './mirror-parts';

export const VersionFiles_FileFragment = graphql(`
  fragment VersionFiles_File on MirrorFile {
    id
    file
    state
    bytesDone
    bytesTotal
    bytesPerSecond
    sha256
    expectedSha256
    verified
    error
    url
    sourceUrl
  }
`);

/** One file of a version, typed from the fragment (gql.tada). */
export type VersionFiles_File = ResultOf<typeof VersionFiles_FileFragment>;

/** The files of one version, listed when its row is opened. */
export function VersionFiles({ files, label }: { files: VersionFiles_File[]; label: string }) {
  return (
    <DataTable
      wrap={false}
      className="dense files"
      label={label}
      columns={['File', { label: 'Size', className: 'num' }, 'State', 'sha256']}
    >
      <tbody>
        {files.map((f) => (
          <tr key={f.id}>
            <th scope="row" className="mono">
              {f.file}
              <div className="sub source" title={f.sourceUrl}>
                from {f.sourceUrl}
              </div>
            </th>
            <td className="num">{fileSize(f)}</td>
            <td>
              {stateBadge(f.state)}
              {f.error ? <div className="form-error file-error">{f.error}</div> : null}
            </td>
            <td>
              <FileDigest file={f} />
            </td>
          </tr>
        ))}
      </tbody>
    </DataTable>
  );
}

function fileSize(f: VersionFiles_File): string {
  if (f.state === 'PRESENT') return formatBytes(f.bytesTotal ?? f.bytesDone);
  if (!arrivingStates.includes(f.state)) return f.bytesDone > 0 ? `${formatBytes(f.bytesDone)} kept` : '—';
  return f.bytesTotal == null
    ? `${formatBytes(f.bytesDone)} so far`
    : `${formatBytes(f.bytesDone)} of ${formatBytes(f.bytesTotal)}`;
}

/**
 * What the bytes hash to once fetched, else what was published. "verified" only when both exist and match; a
 * present file nobody published a digest for says "unverified", so nobody takes it for checked.
 */
function FileDigest({ file }: { file: VersionFiles_File }) {
  const digest = file.sha256 ?? file.expectedSha256;
  return (
    <span className="digest">
      {digest ? (
        <code title={digest}>{shortSha(digest)}</code>
      ) : (
        <span className="muted">{arrivingStates.includes(file.state) ? 'once fetched' : '—'}</span>
      )}
      {file.sha256 == null && file.expectedSha256 ? <span className="muted"> expected</span> : null}
      {file.state === 'PRESENT' ? (
        <VerifiedBadge
          verified={file.verified}
          title={
            file.verified
              ? 'The bytes hash to the published sha256'
              : 'No sha256 was published for this file: nothing to check it against'
          }
        />
      ) : null}
    </span>
  );
}
