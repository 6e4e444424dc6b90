import type { CSSProperties, ReactNode, Ref } from 'react';
import { LoadMoreRow } from './load-more-row';

/**
 * A column heading: its text; or the text with a class (`num` right-aligns a number column); or, with `hidden`,
 * text only a screen reader hears (the actions column has buttons, not a heading, to look at).
 */
export type Column = string | { label: string; className?: string; hidden?: boolean };

/** The heading row of a console table; a column left out (`false`, `null`) is one this viewer does not get. */
export function TableHead({
  columns,
  headRef,
}: {
  columns: (Column | false | null)[];
  headRef?: Ref<HTMLTableSectionElement>;
}) {
  return (
    <thead ref={headRef}>
      <tr>
        {columns.map((column) => {
          if (!column) return null;
          const { label, className, hidden } = typeof column === 'string' ? { label: column } : column;
          return (
            <th key={label} scope="col" className={className}>
              {hidden ? <span className="visually-hidden">{label}</span> : label}
            </th>
          );
        })}
      </tr>
    </thead>
  );
}

/**
 * A console table: `.table` and its modifiers, column headings, and the bodies given as children. It scrolls
 * sideways in its own `.table-wrap`, so a wide table never widens the page; `wrap={false}` where its container
 * scrolls already (a row's detail, the events panel).
 */
export function DataTable({
  columns,
  className,
  label,
  wrap = true,
  tableRef,
  headRef,
  style,
  children,
}: {
  columns: (Column | false | null)[];
  /** Modifiers after `table`: `dense`, and the one its page's stylesheet sizes columns by. */
  className?: string;
  /** The table's accessible name, where the page has several tables or none has a heading of its own. */
  label?: string;
  wrap?: boolean;
  tableRef?: Ref<HTMLTableElement>;
  headRef?: Ref<HTMLTableSectionElement>;
  style?: CSSProperties;
  children: ReactNode;
}) {
  const table = (
    <table className={className ? `table ${className}` : 'table'} aria-label={label} ref={tableRef} style={style}>
      <TableHead columns={columns} headRef={headRef} />
      {children}
    </table>
  );
  return wrap ? <div className="table-wrap">{table}</div> : table;
}

/**
 * The rows a page of a table shows after its data: why it could not be read, that it is being read, that there is
 * nothing (`empty`, given only when the answer came and was empty), and "Load more" while the server has more.
 * Each spans the table.
 */
export function TableStateRows({
  columns,
  problem,
  loading,
  loadingText = 'Loading…',
  empty,
  pageInfo,
  onLoadMore,
}: {
  columns: number;
  problem?: string;
  loading?: boolean;
  loadingText?: string;
  empty?: ReactNode;
  pageInfo?: { hasNextPage: boolean; endCursor?: string | null };
  onLoadMore?: (endCursor: string) => void;
}) {
  return (
    <>
      {problem ? (
        <tr>
          <td colSpan={columns} role="alert" className="form-error">
            {problem}
          </td>
        </tr>
      ) : null}
      {loading ? (
        <tr>
          <td colSpan={columns} className="muted">
            {loadingText}
          </td>
        </tr>
      ) : null}
      {empty ? (
        <tr>
          <td colSpan={columns} className="empty">
            {empty}
          </td>
        </tr>
      ) : null}
      <LoadMoreRow
        columns={columns}
        hasNextPage={pageInfo?.hasNextPage}
        endCursor={pageInfo?.endCursor}
        onLoadMore={onLoadMore}
      />
    </>
  );
}

/** The last column of a table whose rows end in buttons: named for screen readers, blank to the eye. */
export const ACTIONS_COLUMN: Column = { label: 'Actions', hidden: true };
