import { useMemo } from 'react';
import { useQuery } from 'urql';
import { graphql } from '../../graphql/graphql';

// Cost per model for the Models page (#28): what each model's calls and idle replicas cost over the last 24 hours,
// and per million tokens. One cost report for every card, asked only by admins (costReport is theirs).

export const ModelCosts_Query = graphql(`
  query ModelCosts_Report($from: DateTime!, $to: DateTime!) {
    costReport(from: $from, to: $to, by: [MODEL], step: 1440) {
      __typename
      ... on CostReport { currency lines { model totalCost idleCost perMillionTokens } }
    }
  }
`);

export type ModelCost = { totalCost: string; idleCost: string; perMillionTokens: string | null; currency: string };

export function useModelCosts(admin: boolean): Map<string, ModelCost> {
  const variables = useMemo(() => {
    const to = new Date();
    return { from: new Date(to.getTime() - 24 * 3600_000).toISOString(), to: to.toISOString() };
  }, []);
  const [{ data }] = useQuery({ query: ModelCosts_Query, variables, pause: !admin });
  return useMemo(() => {
    const r = data?.costReport;
    const out = new Map<string, ModelCost>();
    if (r?.__typename !== 'CostReport') return out;
    for (const l of r.lines) if (l.model) out.set(l.model, { ...l, currency: r.currency });
    return out;
  }, [data]);
}

/** "3.20 USD in 24 h · 0.41 per 1M tokens": what a card shows. */
export function modelCostWords(c: ModelCost): string {
  const per = c.perMillionTokens ? ` · ${c.perMillionTokens} per 1M tokens` : '';
  return `${c.totalCost} ${c.currency} in 24 h (idle ${c.idleCost})${per}`;
}
