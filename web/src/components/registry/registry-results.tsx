import { useCallback, useEffect, useId, useLayoutEffect, useRef, useState } from 'react';
import { useQuery } from 'urql';
import { type Answer, graphql } from '../../graphql/graphql';
import { isRefusal } from '../../graphql/types';
import { formatCount } from '../../lib/format';
import { DataTable, TableStateRows } from '../common/data-table';
import { describeError, FormError_RefusalFragment } from '../common/form-error';
import { TimeAgo } from '../common/time-ago';
import type { RegistrySort } from './explorer-search';
import { RepoDetail } from './repo-detail';

export type RegistryResults_Model = SearchPage['nodes'][number];

type SearchPage = Answer<typeof RegistryResults_SearchQuery, 'registrySearch', 'RegistrySearch'>;

/** One page of a search; `after` is the previous page's endCursor. */
export const RegistryResults_SearchQuery = graphql(
  `
  query RegistryResults_Search($query: String, $sort: RegistrySort, $first: Int, $after: String) {
    registrySearch(query: $query, sort: $sort, first: $first, after: $after) {
      __typename
      ... on RegistrySearch {
        nodes {
          id
          downloads
          likes
          lastModified
          gated
          hasGguf
        }
        hasNextPage
        endCursor
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

export const REGISTRY_PAGE_SIZE = 20;
const COLUMNS = 4;

type Open = {
  repo: string | undefined;
  context: number | undefined;
  canFetch: boolean;
  onToggle: (id: string, row: HTMLElement | null) => void;
  onContextChange: (context: number | undefined) => void;
  job?: string;
  onJobChange?: (job: string | undefined) => void;
};

/**
 * The search's results, page after page, with the open repository in a row right beneath its own: the listing
 * stays where it is, and so does the row clicked (when another repository above it closes, the page scrolls by
 * what it lost). A repository the URL names that no loaded page lists (a shared link, a later page) opens on top.
 */
export function RegistryResults({
  query,
  sort,
  repo,
  context,
  canFetch,
  onOpen,
  onContextChange,
  job,
  onJobChange,
  pageSize = REGISTRY_PAGE_SIZE,
}: {
  /** Undefined: nothing searched yet. */
  query: string | undefined;
  sort: RegistrySort;
  repo: string | undefined;
  context: number | undefined;
  canFetch: boolean;
  onOpen: (repo: string | undefined) => void;
  onContextChange: (context: number | undefined) => void;
  /** The serve job shown in the open repository (kept in the URL by the route). */
  job?: string;
  onJobChange?: (job: string | undefined) => void;
  pageSize?: number;
}) {
  const [cursors, setCursors] = useState<(string | null)[]>([null]);
  // What each loaded page lists, by its cursor: to know whether the open repository has a row of its own.
  const [listed, setListed] = useState<Record<string, string[]>>({});
  const report = useCallback(
    (after: string | null, ids: string[]) =>
      setListed((l) => (l[after ?? '']?.join('\n') === ids.join('\n') ? l : { ...l, [after ?? '']: ids })),
    [],
  );
  const tableRef = useRef<HTMLTableElement>(null);
  const anchor = useRef<{ id: string; top: number }>(undefined);

  const onToggle = (id: string, row: HTMLElement | null) => {
    anchor.current = row ? { id, top: row.getBoundingClientRect().top } : undefined;
    onOpen(repo === id ? undefined : id);
  };
  // biome-ignore lint/correctness/useExhaustiveDependencies: runs when the open repository changes, and only then.
  useLayoutEffect(() => {
    const was = anchor.current;
    anchor.current = undefined;
    if (!was || !tableRef.current) return;
    const row = [...tableRef.current.querySelectorAll<HTMLElement>('tr[data-repo]')].find(
      (r) => r.dataset.repo === was.id,
    );
    const moved = row ? row.getBoundingClientRect().top - was.top : 0;
    if (moved) window.scrollBy(0, moved);
  }, [repo]);

  const searched = query !== undefined;
  const settled = cursors.every((c) => listed[c ?? ''] !== undefined);
  const pinned =
    repo !== undefined && (!searched || (settled && !cursors.some((c) => listed[c ?? '']?.includes(repo))));
  if (!searched && !pinned) return null;

  const open: Open = { repo, context, canFetch, onToggle, onContextChange, job, onJobChange };
  return (
    <DataTable
      className="dense registry"
      tableRef={tableRef}
      label="Registry repositories"
      columns={[
        'Repository',
        { label: 'Downloads', className: 'num' },
        { label: 'Likes', className: 'num' },
        'Updated',
      ]}
    >
      {pinned && repo ? (
        <tbody className="pinned">
          <ResultRow id={repo} open={open} />
        </tbody>
      ) : null}
      {searched
        ? cursors.map((after, i) => (
            <ResultsPage
              key={after ?? 'first'}
              query={query}
              sort={sort}
              first={pageSize}
              after={after}
              open={open}
              report={report}
              onLoadMore={i === cursors.length - 1 ? (end) => setCursors((c) => [...c, end]) : undefined}
            />
          ))
        : null}
    </DataTable>
  );
}

function ResultsPage({
  query,
  sort,
  first,
  after,
  open,
  report,
  onLoadMore,
}: {
  query: string;
  sort: RegistrySort;
  first: number;
  after: string | null;
  open: Open;
  report: (after: string | null, ids: string[]) => void;
  onLoadMore?: (endCursor: string) => void;
}) {
  const [{ data, fetching, error }] = useQuery({
    query: RegistryResults_SearchQuery,
    variables: { query, sort, first, after },
  });
  const result = data?.registrySearch;
  const page = result?.__typename === 'RegistrySearch' ? result : undefined;
  const refusal = isRefusal(result) ? result : undefined;
  const ids = page?.nodes.map((m) => m.id).join('\n');
  const done = Boolean(result || error);
  useEffect(() => {
    if (done) report(after, ids ? ids.split('\n') : []);
  }, [done, ids, after, report]);

  return (
    <tbody>
      {page?.nodes.map((model) => (
        <ResultRow key={model.id} id={model.id} model={model} open={open} />
      ))}
      <TableStateRows
        columns={COLUMNS}
        problem={refusal?.message ?? describeError(error)}
        loading={!result && fetching}
        loadingText="Searching the registry…"
        empty={
          page && after === null && page.nodes.length === 0
            ? query
              ? `No repository matches “${query}”.`
              : 'The registry lists no repository.'
            : null
        }
        pageInfo={page}
        onLoadMore={onLoadMore}
      />
    </tbody>
  );
}

/** A repository's row, and when it is the open one, the row beneath it that holds it. */
function ResultRow({ id, model, open }: { id: string; model?: RegistryResults_Model; open: Open }) {
  const detailId = useId();
  const isOpen = open.repo === id;
  return (
    <>
      <tr className={`result${isOpen ? ' open' : ''}`} data-repo={id}>
        <th scope="row" className="repo-cell">
          <button
            type="button"
            className="link-button repo-toggle"
            aria-expanded={isOpen}
            aria-controls={isOpen ? detailId : undefined}
            onClick={(e) => open.onToggle(id, e.currentTarget.closest('tr'))}
          >
            {id}
          </button>
          {model?.hasGguf ? <span className="badge">GGUF</span> : null}
          {model?.gated ? (
            <span className="badge warn" title="The registry asks for an access grant before its files download">
              gated
            </span>
          ) : null}
        </th>
        <td className="num" title={model ? `${model.downloads.toLocaleString('en')} downloads` : undefined}>
          {model ? formatCount(model.downloads) : ''}
        </td>
        <td className="num" title={model ? `${model.likes.toLocaleString('en')} likes` : undefined}>
          {model ? formatCount(model.likes) : ''}
        </td>
        <td>{model ? <TimeAgo at={model.lastModified} /> : null}</td>
      </tr>
      {isOpen ? (
        <tr className="repo-row" id={detailId}>
          <td colSpan={COLUMNS}>
            <RepoDetail
              id={id}
              context={open.context}
              canFetch={open.canFetch}
              onContextChange={open.onContextChange}
              job={open.job}
              onJobChange={open.onJobChange}
              onClose={() => open.onToggle(id, null)}
            />
          </td>
        </tr>
      ) : null}
    </>
  );
}
