import { useQuery, useSubscription } from 'urql';
import { graphql } from '../../graphql/graphql';
import { useRefetchOnReconnect } from '../../graphql/use-reconnect';
import { FormError } from '../common/form-error';
import { PageLink } from '../common/page-link';
import { ModelCard, ModelCard_ModelFragment } from './model-card';
import { ModelScaling, ModelScaling_ModelFragment } from './model-scaling';
import { ModelsPage_ChangedSubscription } from './models-page';
import { Playground } from './playground';

export const ModelPage_ModelQuery = graphql(
  `
  query ModelPage_Model($name: String!) {
    model(name: $name) {
      ...ModelCard_Model
      ...ModelScaling_Model
    }
  }
`,
  [ModelCard_ModelFragment, ModelScaling_ModelFragment],
);

/** One model: its card, as on the Models page, and a playground to call it or one of its adapters. */
export function ModelPage({
  name,
  canChange,
  call,
  onCallChange,
  fetchImpl,
}: {
  name: string;
  canChange: boolean;
  /** The model or adapter the playground calls (the URL's ?call=). */
  call?: string;
  onCallChange: (call: string | undefined) => void;
  fetchImpl?: typeof fetch;
}) {
  const [{ data, fetching, error }, refetch] = useQuery({
    query: ModelPage_ModelQuery,
    variables: { name },
    requestPolicy: 'cache-and-network',
  });
  const model = data?.model;
  // Live as the Models page is: the card and the playground's hint follow its replicas as they change.
  useSubscription({ query: ModelsPage_ChangedSubscription });
  useRefetchOnReconnect(refetch);

  return (
    <section className="model-page">
      <header className="page-header">
        <p className="crumbs">
          <PageLink to="/models">Models</PageLink> /
        </p>
        <h1>{name}</h1>
      </header>
      <FormError error={error} />
      {!data && fetching ? <p className="muted">Loading…</p> : null}
      {data && !model ? (
        <p className="empty">
          The catalog holds no model named {name}: it may have been removed.{' '}
          <PageLink to="/models">See every model</PageLink>.
        </p>
      ) : null}
      {model ? (
        <>
          {/* The playground first: it is what the page is for; the card is the Models page's, for reference. */}
          <Playground
            model={model}
            target={call}
            // The model itself is the default: the URL names only an adapter.
            onTargetChange={(next) => onCallChange(next === model.name ? undefined : next)}
            fetchImpl={fetchImpl}
          />
          <ModelCard model={model} canChange={canChange} onModelPage />
          <ModelScaling model={model} canChange={canChange} />
        </>
      ) : null}
    </section>
  );
}
