import { graphql } from '../../graphql/graphql';
import { formatBytes } from '../../lib/format';
import { ConfirmDialog } from '../common/confirm-dialog';
import { FormError_RefusalFragment } from '../common/form-error';
import { DangerButton } from '../common/form-parts';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import { modeWords } from './mirror-parts';
import { useMirrorListingUpdates } from './mirror-updates';
import type { VersionRow_Version } from './version-row';

/** The listing drops the version on the answer; graphcache's updater (graphql/cache.ts) marks it removed elsewhere. */
export const RemoveVersion_RemoveMutation = graphql(
  `
  mutation RemoveVersion_Remove($model: String!, $version: String!, $force: Boolean) {
    removeMirrorVersion(model: $model, version: $version, force: $force) {
      __typename
      ... on RemovedMirrorVersion {
        id
        model
        version
        files
        bytes
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

/**
 * Asks before deleting a version's files, naming it and its size. A version a catalog model uses is refused by the
 * server with its reason; the operator may then remove it anyway, knowing those replicas will fail to load.
 */
export function RemoveVersion({ version, onClose }: { version: VersionRow_Version; onClose: () => void }) {
  const { fetching, error, refusal, run } = useRefusableMutation(
    RemoveVersion_RemoveMutation,
    (d) => d.removeMirrorVersion,
  );
  const listing = useMirrorListingUpdates();
  const name = `${version.model}/${version.version}`;

  const confirm = async (force: boolean) => {
    const outcome = await run({ model: version.model, version: version.version, force });
    if (outcome?.__typename === 'RemovedMirrorVersion') listing.drop(outcome.id);
  };

  const inUse = refusal?.__typename === 'ConflictError';
  return (
    <ConfirmDialog
      title={`Remove ${name} (${formatBytes(version.bytesDone)})?`}
      refusal={refusal}
      error={error}
      onClose={onClose}
      actions={
        <DangerButton busy={fetching} onClick={() => confirm(inUse)}>
          {inUse ? 'Remove anyway' : 'Remove'}
        </DangerButton>
      }
    >
      Its {version.fileCount === 1 ? 'file is' : `${version.fileCount} files are`} deleted from the mirror's disk
      {version.state === 'PRESENT' ? '' : ', and what is still arriving stops'}.
      {version.usedBy.length
        ? ` It is the source of ${version.usedBy.map((u) => `${u.name} (${modeWords[u.mode]})`).join(', ')}: their replicas would fail to load.`
        : ' No catalog model uses it.'}
    </ConfirmDialog>
  );
}
