import { gql } from 'urql';
import type { Bytes } from '../../graphql/types';
import { formatBytes } from '../../lib/format';
import { COLUMNS, VersionRow, type VersionRow_Version, VersionRow_VersionFragment } from './version-row';

export type MirrorTable_Family = {
  __typename?: 'MirrorFamily';
  name: string;
  modelCount: number;
  versions: VersionRow_Version[];
};

export const MirrorTable_FamilyFragment = gql<MirrorTable_Family>`
  fragment MirrorTable_Family on MirrorFamily {
    name
    modelCount
    versions {
      ...VersionRow_Version
    }
  }
  ${VersionRow_VersionFragment}
`;

/**
 * Every version, grouped by family, in the order the server lists them (arriving, failed, held; then by name):
 * never re-sorted here, so rows stay put while bytes tick. A family of one model gets no heading: it would only
 * repeat the row under it.
 */
export function MirrorTable({
  families,
  canChange,
  serve,
  onServeChange,
}: {
  families: MirrorTable_Family[];
  canChange: boolean;
  /** The version ("model/version") whose serve form is open. */
  serve?: string;
  onServeChange?: (serve: string | undefined) => void;
}) {
  return (
    <div className="table-wrap">
      <table className="table mirror">
        <thead>
          <tr>
            <th scope="col">Version</th>
            <th scope="col">State</th>
            <th scope="col">Progress</th>
            <th scope="col">Details</th>
            <th scope="col">
              <span className="visually-hidden">Actions</span>
            </th>
          </tr>
        </thead>
        {families.map((family) => (
          <tbody key={family.name}>
            {family.modelCount > 1 ? (
              <tr className="family">
                <th colSpan={COLUMNS} scope="rowgroup">
                  <h2>
                    {family.name}
                    <span className="family-facts">
                      {family.modelCount} models · {formatBytes(bytesOf(family.versions))}
                    </span>
                  </h2>
                </th>
              </tr>
            ) : null}
            {family.versions.map((v) => (
              <VersionRow
                key={v.id}
                version={v}
                canChange={canChange}
                serving={serve === `${v.model}/${v.version}`}
                onServingChange={
                  onServeChange && ((open) => onServeChange(open ? `${v.model}/${v.version}` : undefined))
                }
              />
            ))}
          </tbody>
        ))}
      </table>
    </div>
  );
}

/**
 * What the versions hold on disk: the server's own definition of a family's bytes and of the disk used (the sum
 * of bytes received), added up from the rows so a heading never shows less than a row under it while bytes tick.
 */
export function bytesOf(versions: { bytesDone: Bytes }[]): Bytes {
  return versions.reduce((n, v) => n + v.bytesDone, 0);
}
