import { type GraphQLResolveInfo, Kind, type SelectionSetNode } from 'graphql';

/**
 * Whether the document asks, anywhere below the field being resolved, for a field of this name: a resolver can
 * then load what that field needs alongside its own data, in one step, rather than let each of thousands of
 * child objects wait on it. Fragments count (named and inline); a directive that skips the field does not
 * matter, as loading it anyway is only wasted work, never a wrong answer.
 */
export function asksFor(info: GraphQLResolveInfo, name: string): boolean {
  const seen = new Set<string>();
  const search = (set: SelectionSetNode | undefined): boolean =>
    (set?.selections ?? []).some((s) => {
      if (s.kind === Kind.FIELD) return s.name.value === name || search(s.selectionSet);
      if (s.kind === Kind.INLINE_FRAGMENT) return search(s.selectionSet);
      if (seen.has(s.name.value)) return false;
      seen.add(s.name.value);
      return search(info.fragments[s.name.value]?.selectionSet);
    });
  return info.fieldNodes.some((node) => search(node.selectionSet));
}
