import { type ReactNode, useState } from 'react';
import { type CombinedError, useClient, useQuery } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { Role } from '../../graphql/types';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { ConfirmButton, FormPanel, LabelledControl, onFormSubmit, SubmitButton } from '../common/form-parts';
import { PageHeader } from '../common/page';
import { type LimitLeft, LimitsLeft } from '../limits/limits-left';
import { CollectionDocuments } from './collection-documents';
import { OrgRemovalPreview, OrgsPage_RemovalQuery } from './org-removal';

/**
 * Every limit the viewer may read, with what is left of it: each org, team and project shows its own (by the key it
 * is stored under, "team:<id>"), so a team's budget is read where the team is.
 */
export const OrgsPage_LimitsQuery = graphql(`
  query OrgsPage_Limits {
    limits {
      __typename
      ... on QueryLimitsSuccess { data { id scopeKey model usage { kind limit remaining } } }
    }
  }
`);

type ScopeLimits = ReadonlyMap<string, LimitLeft[]>;

/** The limits read once for the page, by the scope key they are stored under. */
function useScopeLimits(): ScopeLimits {
  const [{ data }] = useQuery({ query: OrgsPage_LimitsQuery, requestPolicy: 'cache-and-network' });
  const byScope = new Map<string, LimitLeft[]>();
  const answer = data?.limits;
  if (answer?.__typename === 'QueryLimitsSuccess')
    for (const l of answer.data) byScope.set(l.scopeKey, [...(byScope.get(l.scopeKey) ?? []), l]);
  return byScope;
}

// The organisation tree that decides who may call an adapter or a model: orgs, their teams and projects, the users
// and API tokens in them, and the knowledge bases. Everyone signed in reads it; admins change it. Every change asks
// the server again for the tree (one query), so the page shows what the server has, not what it hoped to do.

export const OrgsPage_OrgsQuery = graphql(`
  query OrgsPage_Orgs {
    orgs {
      id
      name
      members { id place member memberName }
      teams {
        id
        name
        path
        projects { id name path }
      }
      collections { id name owner }
    }
  }
`);

const OrgsPage_CreateOrgMutation = graphql(
  `mutation OrgsPage_CreateOrg($name: String!) { createOrg(name: $name) { __typename ...FormError_Refusal } }`,
  [FormError_RefusalFragment],
);
const OrgsPage_CreateTeamMutation = graphql(
  `mutation OrgsPage_CreateTeam($org: String!, $name: String!) { createTeam(org: $org, name: $name) { __typename ...FormError_Refusal } }`,
  [FormError_RefusalFragment],
);
const OrgsPage_CreateProjectMutation = graphql(
  `mutation OrgsPage_CreateProject($team: String!, $name: String!) { createProject(team: $team, name: $name) { __typename ...FormError_Refusal } }`,
  [FormError_RefusalFragment],
);
const OrgsPage_AddMemberMutation = graphql(
  `mutation OrgsPage_AddMember($input: AddMemberInput!) { addMember(input: $input) { __typename ...FormError_Refusal } }`,
  [FormError_RefusalFragment],
);
const OrgsPage_RemoveMemberMutation = graphql(
  `mutation OrgsPage_RemoveMember($id: ID!) { removeMember(id: $id) { __typename ...FormError_Refusal } }`,
  [FormError_RefusalFragment],
);
const OrgsPage_CreateCollectionMutation = graphql(
  `mutation OrgsPage_CreateCollection($input: CreateCollectionInput!) { createCollection(input: $input) { __typename ...FormError_Refusal } }`,
  [FormError_RefusalFragment],
);
const OrgsPage_RenameMutation = graphql(
  `mutation OrgsPage_Rename($id: ID!, $name: String!, $org: Boolean!, $team: Boolean!, $project: Boolean!, $collection: Boolean!) {
    renameOrg(id: $id, name: $name) @include(if: $org) { __typename ...FormError_Refusal }
    renameTeam(id: $id, name: $name) @include(if: $team) { __typename ...FormError_Refusal }
    renameProject(id: $id, name: $name) @include(if: $project) { __typename ...FormError_Refusal }
    renameCollection(id: $id, name: $name) @include(if: $collection) { __typename ...FormError_Refusal }
  }`,
  [FormError_RefusalFragment],
);
const OrgsPage_RemoveMutation = graphql(
  `mutation OrgsPage_Remove($id: ID!, $org: Boolean!, $team: Boolean!, $project: Boolean!, $collection: Boolean!) {
    deleteOrg(id: $id) @include(if: $org) { __typename ...FormError_Refusal }
    deleteTeam(id: $id) @include(if: $team) { __typename ...FormError_Refusal }
    deleteProject(id: $id) @include(if: $project) { __typename ...FormError_Refusal }
    deleteCollection(id: $id) @include(if: $collection) { __typename ...FormError_Refusal }
  }`,
  [FormError_RefusalFragment],
);

type Kind = 'org' | 'team' | 'project' | 'collection';
type Answer = { __typename: string; message?: string; code?: string; field?: string | null } | null | undefined;
type Orgs = NonNullable<ReturnType<typeof useOrgs>['data']>['orgs'];
type Org = Orgs[number];
const only = (kind: Kind) => ({
  org: kind === 'org',
  team: kind === 'team',
  project: kind === 'project',
  collection: kind === 'collection',
});

function useOrgs() {
  const [result, reexecute] = useQuery({ query: OrgsPage_OrgsQuery });
  return { ...result, refresh: () => reexecute({ requestPolicy: 'network-only' }) };
}

/**
 * Sends a change and reads the tree again: the answer's refusal (in the server's words) or transport error is
 * kept for the form that sent it.
 */
function useChange(refresh: () => void) {
  const client = useClient();
  const [busy, setBusy] = useState(false);
  const [problem, setProblem] = useState<{ refusal?: Answer; error?: CombinedError }>();
  const send = async (
    run: () => Promise<{ data?: Record<string, Answer> | null; error?: CombinedError }>,
  ): Promise<boolean> => {
    setBusy(true);
    setProblem(undefined);
    try {
      const r = await run();
      const answer = r.data ? Object.values(r.data).find(Boolean) : undefined;
      if (r.error || !answer || answer.message) {
        setProblem({ refusal: answer?.message ? answer : undefined, error: r.error });
        return false;
      }
      refresh();
      return true;
    } finally {
      setBusy(false);
    }
  };
  const problemView = problem ? (
    <FormError refusal={problem.refusal as Parameters<typeof FormError>[0]['refusal']} error={problem.error ?? null} />
  ) : null;
  return { client, busy, send, problemView, clear: () => setProblem(undefined) };
}

export function OrgsPage({ viewer }: { viewer: { role: Role } }) {
  const orgs = useOrgs();
  const limits = useScopeLimits();
  const admin = viewer.role === 'ADMIN';
  return (
    <section className="orgs-page">
      <PageHeader title="Organisations">
        Who owns and may call adapters, models, training jobs and knowledge bases. A member of a team may call what the
        team owns; owners are written <code>team:acme/support</code> everywhere they are shown.
        {admin ? null : ' Changing them needs the ADMIN role.'}
      </PageHeader>
      <FormError error={orgs.error} />
      {orgs.data ? (
        orgs.data.orgs.length === 0 ? (
          <p className="muted">No organisations yet.{admin ? ' Create one below.' : ''}</p>
        ) : (
          orgs.data.orgs.map((o) => (
            <OrgPanel key={o.id} org={o} admin={admin} refresh={orgs.refresh} limits={limits} />
          ))
        )
      ) : orgs.fetching ? (
        <p className="muted">Loading…</p>
      ) : null}
      {admin ? <CreateOrgForm refresh={orgs.refresh} /> : null}
    </section>
  );
}

function CreateOrgForm({ refresh }: { refresh: () => void }) {
  const c = useChange(refresh);
  const submit = onFormSubmit(async (values, form) => {
    const name = String(values.get('name') ?? '').trim();
    if (await c.send(() => c.client.mutation(OrgsPage_CreateOrgMutation, { name }).toPromise())) form.reset();
  });
  return (
    <FormPanel titleId="create-org-title" title="Create an organisation">
      <form className="form-row" onSubmit={submit}>
        <LabelledControl label="Organisation name">
          <input name="name" required autoComplete="off" placeholder="acme" />
        </LabelledControl>
        <SubmitButton busy={c.busy}>Create organisation</SubmitButton>
      </form>
      {c.problemView}
    </FormPanel>
  );
}

function OrgPanel({
  org,
  admin,
  refresh,
  limits,
}: {
  org: Org;
  admin: boolean;
  refresh: () => void;
  limits: ScopeLimits;
}) {
  const left = (kind: 'org' | 'team' | 'project', id: string, path: string) => (
    <LimitsLeft limits={limits.get(`${kind}:${id}`) ?? []} testId={`limits-${path}`} />
  );
  const membersAt = (place: string) => org.members.filter((m) => m.place === place);
  return (
    <section className="panel org-panel" aria-label={`Organisation ${org.name}`}>
      <Heading level={2} kind="org" id={org.id} name={org.name} path={org.name} admin={admin} refresh={refresh} />
      {left('org', org.id, org.name)}
      <Members place={org.name} members={membersAt(org.name)} admin={admin} refresh={refresh} />
      <ul className="org-tree">
        {org.teams.map((t) => (
          <li key={t.id} className="org-team" aria-label={`Team ${t.path}`}>
            <Heading level={3} kind="team" id={t.id} name={t.name} path={t.path} admin={admin} refresh={refresh} />
            {left('team', t.id, t.path)}
            <Members place={t.path} members={membersAt(t.path)} admin={admin} refresh={refresh} />
            <ul className="org-tree">
              {t.projects.map((p) => (
                <li key={p.id} className="org-project" aria-label={`Project ${p.path}`}>
                  <Heading
                    level={4}
                    kind="project"
                    id={p.id}
                    name={p.name}
                    path={p.path}
                    admin={admin}
                    refresh={refresh}
                  />
                  {left('project', p.id, p.path)}
                  <Members place={p.path} members={membersAt(p.path)} admin={admin} refresh={refresh} />
                </li>
              ))}
            </ul>
            {admin ? <AddChild kind="project" parent={t.path} refresh={refresh} /> : null}
          </li>
        ))}
      </ul>
      {admin ? <AddChild kind="team" parent={org.name} refresh={refresh} /> : null}
      <Collections org={org} admin={admin} refresh={refresh} />
      {admin ? <AddMemberForm org={org} refresh={refresh} /> : null}
    </section>
  );
}

/** A name with its Rename and Remove; Remove shows what removing it would do before anything is removed. */
function Heading({
  level,
  kind,
  id,
  name,
  path,
  admin,
  refresh,
}: {
  level: 2 | 3 | 4;
  kind: Exclude<Kind, 'collection'>;
  id: string;
  name: string;
  path: string;
  admin: boolean;
  refresh: () => void;
}) {
  const H = `h${level}` as const;
  const label = { org: 'Organisation', team: 'Team', project: 'Project' }[kind];
  return (
    <div className="org-heading">
      <H>
        <span className="muted">{label}</span> <span className="mono">{path}</span>
      </H>
      {admin ? (
        <Actions kind={kind} id={id} name={name} path={path} refresh={refresh}>
          {(close, change) => (
            <RemovalConfirm
              kind={kind}
              id={id}
              path={path}
              busy={change.busy}
              onKeep={close}
              onConfirm={async () => {
                if (
                  await change.send(() =>
                    change.client.mutation(OrgsPage_RemoveMutation, { id, ...only(kind) }).toPromise(),
                  )
                )
                  close();
              }}
            />
          )}
        </Actions>
      ) : null}
    </div>
  );
}

/** Rename and Remove for one thing; `confirm` is the question Remove asks. */
function Actions({
  kind,
  id,
  name,
  path,
  refresh,
  children: confirm,
}: {
  kind: Kind;
  id: string;
  name: string;
  path: string;
  refresh: () => void;
  children: (close: () => void, change: ReturnType<typeof useChange>) => ReactNode;
}) {
  const [open, setOpen] = useState<'rename' | 'remove'>();
  const change = useChange(refresh);
  const close = () => {
    setOpen(undefined);
    change.clear();
  };
  const rename = onFormSubmit(async (values) => {
    const next = String(values.get('name') ?? '').trim();
    const ok = await change.send(() =>
      change.client.mutation(OrgsPage_RenameMutation, { id, name: next, ...only(kind) }).toPromise(),
    );
    if (ok) close();
  });
  return (
    <div className="org-actions">
      {open === undefined ? (
        <>
          <button type="button" className="button small" onClick={() => setOpen('rename')}>
            Rename <span className="visually-hidden">{path}</span>
          </button>
          <ConfirmButton onClick={() => setOpen('remove')}>
            Remove <span className="visually-hidden">{path}</span>
          </ConfirmButton>
        </>
      ) : null}
      {open === 'rename' ? (
        <form className="form-row" aria-label={`Rename ${path}`} onSubmit={rename}>
          <LabelledControl label="New name">
            <input name="name" required defaultValue={name} autoComplete="off" />
          </LabelledControl>
          <SubmitButton busy={change.busy} className="button small primary">
            Save
          </SubmitButton>
          <button type="button" className="button small" onClick={close}>
            Cancel
          </button>
        </form>
      ) : null}
      {open === 'remove' ? confirm(close, change) : null}
      {change.problemView}
    </div>
  );
}

/** The question before a removal, with what it would do as the server works it out. */
function RemovalConfirm({
  kind,
  id,
  path,
  busy,
  onConfirm,
  onKeep,
}: {
  kind: Exclude<Kind, 'collection'>;
  id: string;
  path: string;
  busy: boolean;
  onConfirm: () => void;
  onKeep: () => void;
}) {
  const [r] = useQuery({ query: OrgsPage_RemovalQuery, requestPolicy: 'network-only' });
  const org = r.data?.orgs.find((o) => (kind === 'org' ? o.id === id : true));
  const removal =
    kind === 'org'
      ? org?.removal
      : r.data?.orgs
          .flatMap((o) => o.teams)
          .flatMap((t) => (kind === 'team' ? [t] : t.projects))
          .find((x) => x.id === id)?.removal;
  return (
    <fieldset className="confirm" aria-label={`Remove ${path}?`}>
      <legend className="confirm-title">Remove {path}?</legend>
      {removal ? <OrgRemovalPreview removal={removal} /> : <p className="muted">Working out what it holds…</p>}
      <FormError error={r.error} />
      <div className="confirm-actions">
        <button
          type="button"
          className="button small danger"
          disabled={busy || !removal || removal.blocked}
          onClick={onConfirm}
        >
          Remove {path}
        </button>
        <button type="button" className="button small" onClick={onKeep}>
          Keep it
        </button>
      </div>
    </fieldset>
  );
}

function Members({
  place,
  members,
  admin,
  refresh,
}: {
  place: string;
  members: Org['members'];
  admin: boolean;
  refresh: () => void;
}) {
  const change = useChange(refresh);
  const [asking, setAsking] = useState<string>();
  if (!members.length) return <p className="muted org-members">No members of its own.</p>;
  return (
    <div className="org-members">
      <ul aria-label={`Members of ${place}`} className="org-member-list">
        {members.map((m) => (
          <li key={m.id} className="org-member">
            <span className="mono" title={m.member}>
              {m.memberName}
            </span>
            {admin && asking !== m.id ? (
              <button type="button" className="button small" onClick={() => setAsking(m.id)}>
                Remove{' '}
                <span className="visually-hidden">
                  {m.memberName} from {place}
                </span>
              </button>
            ) : null}
            {asking === m.id ? (
              <fieldset className="confirm" aria-label={`Remove ${m.memberName} from ${place}?`}>
                <span className="hint">
                  {m.memberName} can no longer call what {place} owns, at once (a script using it gets 404s).
                </span>
                <div className="confirm-actions">
                  <button
                    type="button"
                    className="button small danger"
                    disabled={change.busy}
                    onClick={async () => {
                      if (
                        await change.send(() =>
                          change.client.mutation(OrgsPage_RemoveMemberMutation, { id: m.id }).toPromise(),
                        )
                      )
                        setAsking(undefined);
                    }}
                  >
                    End membership
                  </button>
                  <button type="button" className="button small" onClick={() => setAsking(undefined)}>
                    Keep it
                  </button>
                </div>
              </fieldset>
            ) : null}
          </li>
        ))}
      </ul>
      {change.problemView}
    </div>
  );
}

/** A team in an org, or a project in a team. */
function AddChild({ kind, parent, refresh }: { kind: 'team' | 'project'; parent: string; refresh: () => void }) {
  const c = useChange(refresh);
  const submit = onFormSubmit(async (values, form) => {
    const name = String(values.get('name') ?? '').trim();
    const ok = await c.send(() =>
      kind === 'team'
        ? c.client.mutation(OrgsPage_CreateTeamMutation, { org: parent, name }).toPromise()
        : c.client.mutation(OrgsPage_CreateProjectMutation, { team: parent, name }).toPromise(),
    );
    if (ok) form.reset();
  });
  return (
    <div className="org-add">
      <form className="form-row" aria-label={`Add a ${kind} to ${parent}`} onSubmit={submit}>
        <LabelledControl label={kind === 'team' ? `New team in ${parent}` : `New project in ${parent}`}>
          <input name="name" required autoComplete="off" />
        </LabelledControl>
        <SubmitButton busy={c.busy} className="button small">
          Add {kind}
        </SubmitButton>
      </form>
      {c.problemView}
    </div>
  );
}

function AddMemberForm({ org, refresh }: { org: Org; refresh: () => void }) {
  const c = useChange(refresh);
  const places = [org.name, ...org.teams.flatMap((t) => [t.path, ...t.projects.map((p) => p.path)])];
  const submit = onFormSubmit(async (values, form) => {
    const [, team, project] = String(values.get('place')).split('/');
    const who = String(values.get('member') ?? '').trim();
    const input = {
      org: org.name,
      team: team ?? null,
      project: project ?? null,
      // An email is a user; anything else is taken as an API token's id (the Tokens page shows it).
      ...(who.includes('@') ? { user: who } : { apiToken: who }),
    };
    if (await c.send(() => c.client.mutation(OrgsPage_AddMemberMutation, { input }).toPromise())) form.reset();
  });
  return (
    <div className="org-add">
      <form className="form-row" aria-label={`Add a member to ${org.name}`} onSubmit={submit}>
        <LabelledControl label="Place">
          <select name="place">
            {places.map((p) => (
              <option key={p} value={p}>
                {p}
              </option>
            ))}
          </select>
        </LabelledControl>
        <LabelledControl label="User email or API token id">
          <input name="member" required autoComplete="off" />
        </LabelledControl>
        <SubmitButton busy={c.busy} className="button small">
          Add member
        </SubmitButton>
      </form>
      {c.problemView}
    </div>
  );
}

function Collections({ org, admin, refresh }: { org: Org; admin: boolean; refresh: () => void }) {
  const c = useChange(refresh);
  const submit = onFormSubmit(async (values, form) => {
    const input = {
      org: org.name,
      name: String(values.get('name') ?? '').trim(),
      owner: String(values.get('owner') ?? '').trim(),
    };
    if (await c.send(() => c.client.mutation(OrgsPage_CreateCollectionMutation, { input }).toPromise())) form.reset();
  });
  return (
    <div className="org-collections">
      <h3>Knowledge-base collections</h3>
      {org.collections.length ? (
        <ul aria-label={`Collections of ${org.name}`} className="org-tree">
          {org.collections.map((k) => (
            <li key={k.id} className="org-heading">
              <span>
                <span className="mono">{k.name}</span> <span className="muted">· read by {k.owner}</span>
              </span>
              {admin ? (
                <Actions kind="collection" id={k.id} name={k.name} path={`${org.name}/${k.name}`} refresh={refresh}>
                  {(close, change) => (
                    <fieldset className="confirm" aria-label={`Remove ${k.name}?`}>
                      <span className="hint">Its record goes; adapters trained from it keep their lineage.</span>
                      <div className="confirm-actions">
                        <button
                          type="button"
                          className="button small danger"
                          disabled={change.busy}
                          onClick={async () => {
                            const ok = await change.send(() =>
                              change.client
                                .mutation(OrgsPage_RemoveMutation, { id: k.id, ...only('collection') })
                                .toPromise(),
                            );
                            if (ok) close();
                          }}
                        >
                          Remove {k.name}
                        </button>
                        <button type="button" className="button small" onClick={close}>
                          Keep it
                        </button>
                      </div>
                    </fieldset>
                  )}
                </Actions>
              ) : null}
              <CollectionDocuments org={org.name} collection={k} admin={admin} />
            </li>
          ))}
        </ul>
      ) : (
        <p className="muted">None.</p>
      )}
      {admin ? (
        <form className="form-row" aria-label={`Add a collection to ${org.name}`} onSubmit={submit}>
          <LabelledControl label="Collection name">
            <input name="name" required autoComplete="off" />
          </LabelledControl>
          <LabelledControl label="Owner">
            <input name="owner" required autoComplete="off" placeholder={`team:${org.name}/…`} />
          </LabelledControl>
          <SubmitButton busy={c.busy} className="button small">
            Add collection
          </SubmitButton>
        </form>
      ) : null}
      {c.problemView}
    </div>
  );
}
