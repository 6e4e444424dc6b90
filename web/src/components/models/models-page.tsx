import { useEffect } from 'react';
import { gql, useQuery } from 'urql';
import { describeError } from '../common/form-error';
import { PageHeader } from '../common/page';
import { PageLink } from '../common/page-link';
import { ModelCard, type ModelCard_Model, ModelCard_ModelFragment } from './model-card';

export const ModelsPage_ModelsQuery = gql<{ models: ModelCard_Model[] }, Record<string, never>>`
  query ModelsPage_Models {
    models {
      ...ModelCard_Model
    }
  }
  ${ModelCard_ModelFragment}
`;

/**
 * There is no subscription for models or replicas: while a replica is on its way (pending or loading), the list
 * is read again on this period, so it shows when it is placed, ready or failed. Settled, it is not polled.
 */
export const SETTLING_REFRESH_MS = 5_000;

export function ModelsPage({ canChange }: { canChange: boolean }) {
  const [{ data, fetching, error }, refetch] = useQuery({
    query: ModelsPage_ModelsQuery,
    // Re-read on every visit: replicas moved while the page was closed.
    requestPolicy: 'cache-and-network',
  });
  const models = data?.models;
  const settling = models?.some((m) => m.replicas.some((r) => r.state === 'PENDING' || r.state === 'LOADING'));
  useEffect(() => {
    if (!settling) return;
    const t = setInterval(() => {
      if (document.visibilityState === 'visible') refetch({ requestPolicy: 'network-only' });
    }, SETTLING_REFRESH_MS);
    return () => clearInterval(t);
  }, [settling, refetch]);

  return (
    <section>
      <PageHeader title="Models">
        The models the fleet serves: how each runs, its replicas and where they are, and its adapters.
      </PageHeader>
      {settling ? (
        <p className="live-state muted">Replicas are being placed or loading: the list is read again every 5 s.</p>
      ) : null}
      {error ? (
        <p role="alert" className="form-error">
          {describeError(error)}
        </p>
      ) : null}
      {models ? (
        models.length === 0 ? (
          <p className="empty">
            The catalog holds no model yet. A model gets here when a mirrored version is served (the Serve button of a
            present version on the <PageLink to="/mirror">Mirror</PageLink> page), when one is served from the registry
            in one step, or when hangar.yaml declares it.
          </p>
        ) : (
          <div className="model-list">
            {models.map((m) => (
              <ModelCard key={m.id} model={m} canChange={canChange} />
            ))}
          </div>
        )
      ) : fetching ? (
        <p className="muted">Loading…</p>
      ) : null}
    </section>
  );
}
