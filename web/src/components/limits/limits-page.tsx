import { useState } from 'react';
import { useMutation, useQuery } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { Role } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { formatCount } from '../../lib/format';
import { ACTIONS_COLUMN, DataTable } from '../common/data-table';
import { describeError, FormError, FormError_RefusalFragment } from '../common/form-error';
import { FormPanel, InlineProblem, LabelledControl, onFormSubmit, SubmitButton } from '../common/form-parts';
import { PageHeader } from '../common/page';
import { useRefusableMutation } from '../common/use-refusable-mutation';

// Limits and budgets (#28): every scope's limits with what is used of each now and how many requests each
// refused, so an operator sees at a glance who is being held back; admins set and remove them here.

export const LimitsPage_LimitFragment = graphql(`
  fragment LimitsPage_Limit on Limit {
    id
    scope
    scopeKey
    model
    declared
    refused
    refusedBy(top: 3) { caller count }
    usage { kind limit used remaining resetAt }
  }
`);

export const LimitsPage_LimitsQuery = graphql(
  `
  query LimitsPage_Limits {
    limits {
      __typename
      ... on QueryLimitsSuccess { data { ...LimitsPage_Limit } }
      ... on Error { message }
    }
  }
`,
  [LimitsPage_LimitFragment],
);

export const LimitsPage_SetMutation = graphql(
  `
  mutation LimitsPage_Set($scope: String!, $model: String, $limit: LimitInput!) {
    setLimit(scope: $scope, model: $model, limit: $limit) {
      __typename
      ... on Limit { ...LimitsPage_Limit }
      ...FormError_Refusal
    }
  }
`,
  [LimitsPage_LimitFragment, FormError_RefusalFragment],
);

export const LimitsPage_RemoveMutation = graphql(
  `
  mutation LimitsPage_Remove($scope: String!, $model: String) {
    removeLimit(scope: $scope, model: $model) {
      __typename
      ... on Limit { id }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

type Limit = ResultOf<typeof LimitsPage_LimitFragment>;

const KIND_WORDS: Record<string, string> = {
  requestsPerMinute: 'requests / minute',
  tokensPerMinute: 'tokens / minute',
  concurrentRequests: 'requests at once',
  tokensPerDay: 'tokens / day',
  tokensPerMonth: 'tokens / month',
  spendPerMonth: 'spend / month',
};

const amount = (kind: string, v: number) => (kind === 'spendPerMonth' ? v.toFixed(2) : v.toLocaleString('en'));

export function LimitsPage({ viewer }: { viewer: { role: Role } }) {
  const [{ data, fetching, error }, refetch] = useQuery({
    query: LimitsPage_LimitsQuery,
    requestPolicy: 'cache-and-network',
  });
  const result = data?.limits;
  const limits = result?.__typename === 'QueryLimitsSuccess' ? (result.data as Limit[]) : [];
  const admin = viewer.role === 'ADMIN';
  const reload = () => refetch({ requestPolicy: 'network-only' });
  return (
    <section>
      <PageHeader title="Limits">
        Rate limits and budgets on keys, users, teams, projects and orgs. Every limit that applies to a request is
        checked and the tightest decides; a refused request gets OpenAI's 429 with when to retry.
      </PageHeader>
      <FormError error={error} />
      {result && result.__typename !== 'QueryLimitsSuccess' && 'message' in result ? (
        <p className="form-error">{result.message}</p>
      ) : null}
      {data ? (
        limits.length ? (
          <DataTable columns={['Scope', 'Model', 'Limit', 'Used now', 'Refused', admin && ACTIONS_COLUMN]}>
            <tbody>
              {limits.map((l) => (
                <LimitRows key={l.id} limit={l} admin={admin} onChange={reload} />
              ))}
            </tbody>
          </DataTable>
        ) : (
          <p className="empty">No limits{admin ? ': set one below.' : ' apply to you.'}</p>
        )
      ) : fetching ? (
        <p className="muted">Loading…</p>
      ) : null}
      {admin ? <SetLimitForm onSet={reload} /> : null}
    </section>
  );
}

function LimitRows({ limit, admin, onChange }: { limit: Limit; admin: boolean; onChange: () => void }) {
  const [{ fetching }, remove] = useMutation(LimitsPage_RemoveMutation);
  const [problem, setProblem] = useState<string>();
  const onRemove = async () => {
    setProblem(undefined);
    // By its stored key: the label ("key:ci (alice@…)") is for people, not a name the server looks up.
    const r = await remove({ scope: limit.scopeKey, model: limit.model });
    if (isRefusal(r.data?.removeLimit)) setProblem(r.data?.removeLimit.message);
    else if (r.error) setProblem(describeError(r.error));
    else onChange();
  };
  return (
    <>
      {limit.usage.map((u, i) => {
        const share = u.limit > 0 ? Math.min(1, u.used / u.limit) : 1;
        return (
          <tr key={u.kind} data-testid="limit-row">
            {i === 0 ? (
              <th scope="row" rowSpan={limit.usage.length}>
                <ScopeName scope={limit.scope} />
                {limit.declared ? (
                  <>
                    {' '}
                    <span className="badge muted" title="Declared in hangar.yaml: change it there">
                      hangar.yaml
                    </span>
                  </>
                ) : null}
              </th>
            ) : null}
            {i === 0 ? (
              <td rowSpan={limit.usage.length}>{limit.model ?? <span className="muted">every model</span>}</td>
            ) : null}
            <td>
              {amount(u.kind, u.limit)} {KIND_WORDS[u.kind] ?? u.kind}
            </td>
            <td className={u.remaining === 0 ? 'warn' : undefined}>
              <meter min={0} max={1} value={share} high={0.8} optimum={0} aria-label={`${u.kind} used`} />
              <br />
              {amount(u.kind, u.used)} used, {amount(u.kind, u.remaining)} left
            </td>
            {i === 0 ? (
              <td rowSpan={limit.usage.length} className={limit.refused > 0 ? 'warn' : 'muted'}>
                {formatCount(limit.refused)}
                {limit.refusedBy.length ? (
                  <ul className="refused-by" aria-label="Refused most in the last minute">
                    {limit.refusedBy.map((r) => (
                      <li key={r.caller} data-testid="refused-by">
                        <ScopeName scope={r.caller} /> × {formatCount(r.count)}
                      </li>
                    ))}
                  </ul>
                ) : null}
              </td>
            ) : null}
            {admin && i === 0 ? (
              <td className="actions" rowSpan={limit.usage.length}>
                {limit.declared ? null : (
                  <button type="button" className="button small danger" onClick={onRemove} disabled={fetching}>
                    Remove
                  </button>
                )}
                <InlineProblem problem={problem} />
              </td>
            ) : null}
          </tr>
        );
      })}
    </>
  );
}

const FIELDS = [
  ['requestsPerMinute', 'Requests / minute'],
  ['tokensPerMinute', 'Tokens / minute'],
  ['concurrentRequests', 'At once'],
  ['tokensPerDay', 'Tokens / day'],
  ['tokensPerMonth', 'Tokens / month'],
  ['spendPerMonth', 'Spend / month'],
] as const;

function SetLimitForm({ onSet }: { onSet: () => void }) {
  const { fetching, error, refusal, run } = useRefusableMutation(LimitsPage_SetMutation, (d) => d.setLimit);
  const [done, setDone] = useState<string>();
  const submit = onFormSubmit(async (values, form) => {
    setDone(undefined);
    const limit: Record<string, number> = {};
    for (const [name] of FIELDS) {
      const v = String(values.get(name) ?? '').trim();
      if (v !== '') limit[name] = Number(v);
    }
    const scope = String(values.get('scope') ?? '').trim();
    const model = String(values.get('model') ?? '').trim() || null;
    const outcome = await run({ scope, model, limit });
    if (outcome?.__typename === 'Limit') {
      setDone(`Set the limits of ${outcome.scope}${outcome.model ? ` on ${outcome.model}` : ''}.`);
      form.reset();
      onSet();
    }
  });
  return (
    <FormPanel titleId="set-limit-title" title="Set a limit">
      <form className="form-row" onSubmit={submit}>
        <LabelledControl label="Scope">
          <input
            name="scope"
            required
            placeholder="team:acme/research"
            autoComplete="off"
            aria-describedby="scope-hint"
          />
        </LabelledControl>
        <LabelledControl label="Model">
          <input name="model" placeholder="every model" autoComplete="off" />
        </LabelledControl>
        {FIELDS.map(([name, label]) => (
          <LabelledControl key={name} label={label}>
            <input name={name} type="number" min={0} step={name === 'spendPerMonth' ? 0.01 : 1} inputMode="decimal" />
          </LabelledControl>
        ))}
        <SubmitButton busy={fetching}>Set limit</SubmitButton>
      </form>
      <p id="scope-hint" className="hint">
        A scope is key:&lt;token id&gt;, user:&lt;email&gt;, team:&lt;org&gt;/&lt;team&gt;,
        project:&lt;org&gt;/&lt;team&gt;/&lt;project&gt; or org:&lt;org&gt;. Setting replaces what the scope had for
        that model; an empty field is not limited.
      </p>
      <FormError refusal={refusal} error={error} />
      {done ? (
        <p role="status" className="notice">
          {done}
        </p>
      ) : null}
    </FormPanel>
  );
}

/** "key:ci (alice@example.com)" on two lines: the scope, then whose key it is. */
function ScopeName({ scope }: { scope: string }) {
  const at = scope.indexOf(' (');
  if (at < 0) return <>{scope}</>;
  return (
    <>
      {scope.slice(0, at)}
      <br />
      <span className="muted">{scope.slice(at + 1)}</span>
    </>
  );
}
