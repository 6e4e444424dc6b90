/** The last row of a paged table: asks for the page after `endCursor` while the server says there is one. */
export function LoadMoreRow({
  columns,
  hasNextPage,
  endCursor,
  onLoadMore,
}: {
  columns: number;
  hasNextPage: boolean | undefined;
  endCursor: string | null | undefined;
  onLoadMore: ((after: string) => void) | undefined;
}) {
  if (!onLoadMore || !hasNextPage || !endCursor) return null;
  return (
    <tr className="table-more">
      <td colSpan={columns}>
        <button type="button" className="button" onClick={() => onLoadMore(endCursor)}>
          Load more
        </button>
      </td>
    </tr>
  );
}
