import { type FormEvent, useId, useState } from 'react';
import type { ExplorerNavigate, ExplorerSearch, RegistrySort } from './explorer-search';
import { RegistryResults } from './registry-results';

const sortWords: Record<RegistrySort, string> = {
  downloads: 'Most downloaded',
  likes: 'Most liked',
  lastModified: 'Recently updated',
};

/**
 * The model registry, searched from the console: a repository opens beneath its row with its file sets judged
 * against the fleet, and a set is fetched into the mirror from there. The search and the open repository are the
 * caller's (the route keeps them in the URL); without a caller they live here.
 */
export function RegistryExplorer({
  canFetch,
  search: controlled,
  onSearchChange,
}: {
  /** Operators and admins fetch; a viewer sees the same judgement without the buttons. */
  canFetch: boolean;
  search?: ExplorerSearch;
  onSearchChange?: ExplorerNavigate;
}) {
  const [local, setLocal] = useState<ExplorerSearch>({});
  const search = controlled ?? local;
  const navigate: ExplorerNavigate = onSearchChange ?? ((next) => setLocal(next));
  const sort = search.sort ?? 'downloads';
  const state = { q: search.q, sort: search.sort, repo: search.repo, ctx: search.ctx, job: search.job };

  return (
    <div className="registry-explorer">
      <SearchForm
        // A search the URL changes (back, a link) shows in the box.
        key={search.q ?? ''}
        query={search.q}
        sort={sort}
        // A new search closes the open repository: its row is gone. The context stays: it is the operator's plan.
        onSearch={(q) => navigate({ ...state, q, repo: undefined, job: undefined }, { push: true })}
        onSort={(s) => navigate({ ...state, sort: s === 'downloads' ? undefined : s }, { push: true })}
      />
      <RegistryResults
        key={`${search.q ?? ''}\u0000${sort}`}
        query={search.q}
        sort={sort}
        repo={search.repo}
        context={search.ctx}
        canFetch={canFetch}
        job={search.job}
        onOpen={(repo) => navigate({ ...state, repo, job: undefined })}
        onJobChange={(job) => navigate({ ...state, job })}
        onContextChange={(ctx) => navigate({ ...state, ctx })}
      />
    </div>
  );
}

function SearchForm({
  query,
  sort,
  onSearch,
  onSort,
}: {
  query: string | undefined;
  sort: RegistrySort;
  onSearch: (query: string) => void;
  onSort: (sort: RegistrySort) => void;
}) {
  const [text, setText] = useState(query ?? '');
  const inputId = useId();
  const sortId = useId();
  const submit = (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    onSearch(text.trim());
  };
  return (
    <search aria-label="Registry search">
      <form className="registry-search" onSubmit={submit}>
        <div className="field grow">
          <label htmlFor={inputId}>Search the registry</label>
          <input
            id={inputId}
            type="search"
            value={text}
            onChange={(e) => setText(e.target.value)}
            placeholder="qwen3 gguf, Llama-3.1-8B-Instruct, an owner/name…"
            autoComplete="off"
            spellCheck={false}
          />
        </div>
        <div className="field">
          <label htmlFor={sortId}>Sort by</label>
          <select
            id={sortId}
            value={sort}
            // Re-sorts what is shown; before any search, it sets the order the first one uses.
            onChange={(e) => onSort(e.target.value as RegistrySort)}
          >
            {Object.entries(sortWords).map(([value, words]) => (
              <option key={value} value={value}>
                {words}
              </option>
            ))}
          </select>
        </div>
        <button type="submit" className="button primary">
          Search
        </button>
      </form>
    </search>
  );
}
