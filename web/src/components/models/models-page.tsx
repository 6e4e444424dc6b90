import { useSyncExternalStore } from 'react';
import { useQuery, useSubscription } from 'urql';
import { graphql } from '../../graphql/graphql';
import { type LiveState, live } from '../../graphql/live';
import { useRefetchOnReconnect } from '../../graphql/use-reconnect';
import { FormError } from '../common/form-error';
import { PageHeader } from '../common/page';
import { PageLink } from '../common/page-link';
import { type ModelCost, modelCostWords, useModelCosts } from '../cost/model-costs';
import { ModelCard, ModelCard_ModelFragment } from './model-card';

export const ModelsPage_ModelsQuery = graphql(
  `
  query ModelsPage_Models {
    models {
      ...ModelCard_Model
    }
  }
`,
  [ModelCard_ModelFragment],
);

/**
 * Every model that changes (it, a replica, an adapter), whole, from wherever it was written: graphcache updates its
 * card by id; a new one joins the list and a removed one (model null) leaves it (graphql/cache.ts).
 */
export const ModelsPage_ChangedSubscription = graphql(
  `
  subscription ModelsPage_Changed {
    modelChanged {
      modelId
      model {
        ...ModelCard_Model
      }
    }
  }
`,
  [ModelCard_ModelFragment],
);

const liveText: Record<LiveState, string> = {
  connecting: 'Connecting for live updates…',
  live: 'Live: cards follow their replicas as they are placed, load and serve.',
  reconnecting: 'Reconnecting: the list is re-read when the connection is back.',
  stopped: 'Live updates stopped: the server refused the connection. Sign in again to resume them.',
};

export function ModelsPage({ canChange, admin = false }: { canChange: boolean; admin?: boolean }) {
  const costs = useModelCosts(admin);
  const [{ data, fetching, error }, refetch] = useQuery({
    query: ModelsPage_ModelsQuery,
    // Re-read on every visit: replicas moved while the page was closed.
    requestPolicy: 'cache-and-network',
  });
  const models = data?.models;
  useSubscription({ query: ModelsPage_ChangedSubscription });
  const liveState = useSyncExternalStore(live.subscribe, live.get, live.get);
  // Events sent while the socket was down are not replayed: the list is read afresh instead.
  useRefetchOnReconnect(refetch);

  return (
    <section>
      <PageHeader title="Models">
        The models the fleet serves: how each runs, its replicas and where they are, and its adapters.
      </PageHeader>
      <p className="live-state" aria-live="polite">
        <span className={`dot ${liveState === 'live' ? 'ok' : 'idle'}`} aria-hidden="true" />
        {liveText[liveState]}
      </p>
      <FormError error={error} />
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
              <ModelCard
                key={m.id}
                model={m}
                canChange={canChange}
                cost={costs.has(m.name) ? modelCostWords(costs.get(m.name) as ModelCost) : undefined}
              />
            ))}
          </div>
        )
      ) : fetching ? (
        <p className="muted">Loading…</p>
      ) : null}
    </section>
  );
}
