import { type AnyVariables, type DocumentInput, type UseQueryArgs, useQuery } from 'urql';
import { useRefetchOnReconnect } from '../../graphql/use-reconnect';

/**
 * One page of a live, cursor-paged list (audit events, training jobs). The first page (`after` null) is read again
 * on every visit and after the socket comes back: things happened while the page was closed or the socket down.
 * A later page is read once from the cache: only the first page's events change it.
 */
export function usePageQuery<Data, Variables extends AnyVariables>(
  query: DocumentInput<Data, Variables>,
  variables: Variables & { after: string | null },
) {
  const first = variables.after === null;
  const [result, refetch] = useQuery<Data, Variables>({
    query,
    variables,
    requestPolicy: first ? 'cache-and-network' : 'cache-first',
  } as UseQueryArgs<Variables, Data>);
  useRefetchOnReconnect(refetch, first);
  return result;
}
