import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { table } from './format.js';
import type { HangarClient } from './session.js';

// `hangar org …`: the organisation tree that owns adapters, models, jobs and knowledge bases, from a terminal.
// Things are named as owners are written (acme, acme/support, acme/support/tickets); the ids stay the server's.
// A removal prints what it would do first and needs --yes, because it ends memberships that scripts rely on.

const RemovalFields = graphql(`
  fragment Cli_OrgRemoval on OrgRemoval {
    what blocked collections models adapters trainJobs teams projects members apiTokens
  }
`);

const Cli_OrgsQuery = graphql(
  `query Cli_Orgs {
    orgs {
      id name
      teams { id name path projects { id name path members { id member } } members { id member } }
      members { id place member }
      collections { id name owner }
    }
  }`,
);
const Cli_OrgRemovalQuery = graphql(
  `query Cli_OrgRemoval($org: String!) {
    org(name: $org) {
      id name removal { ...Cli_OrgRemoval }
      teams { id name removal { ...Cli_OrgRemoval } projects { id name removal { ...Cli_OrgRemoval } } }
    }
  }`,
  [RemovalFields],
);
const Cli_CreateOrgMutation = graphql(
  `mutation Cli_CreateOrg($name: String!) { createOrg(name: $name) { __typename ... on Error { code message } ... on Org { id name } } }`,
);
const Cli_RenameOrgMutation = graphql(
  `mutation Cli_RenameOrg($id: ID!, $name: String!) { renameOrg(id: $id, name: $name) { __typename ... on Error { code message } ... on Org { name } } }`,
);
const Cli_DeleteOrgMutation = graphql(
  `mutation Cli_DeleteOrg($id: ID!) { deleteOrg(id: $id) { __typename ... on Error { code message } ... on RemovedOrg { name } } }`,
);
const Cli_CreateTeamMutation = graphql(
  `mutation Cli_CreateTeam($org: String!, $name: String!) { createTeam(org: $org, name: $name) { __typename ... on Error { code message } ... on Team { path } } }`,
);
const Cli_RenameTeamMutation = graphql(
  `mutation Cli_RenameTeam($id: ID!, $name: String!) { renameTeam(id: $id, name: $name) { __typename ... on Error { code message } ... on Team { path } } }`,
);
const Cli_DeleteTeamMutation = graphql(
  `mutation Cli_DeleteTeam($id: ID!) { deleteTeam(id: $id) { __typename ... on Error { code message } ... on Org { name } } }`,
);
const Cli_CreateProjectMutation = graphql(
  `mutation Cli_CreateProject($team: String!, $name: String!) { createProject(team: $team, name: $name) { __typename ... on Error { code message } ... on Project { path } } }`,
);
const Cli_RenameProjectMutation = graphql(
  `mutation Cli_RenameProject($id: ID!, $name: String!) { renameProject(id: $id, name: $name) { __typename ... on Error { code message } ... on Project { path } } }`,
);
const Cli_DeleteProjectMutation = graphql(
  `mutation Cli_DeleteProject($id: ID!) { deleteProject(id: $id) { __typename ... on Error { code message } ... on Team { path } } }`,
);
const Cli_AddMemberMutation = graphql(
  `mutation Cli_AddMember($input: AddMemberInput!) { addMember(input: $input) { __typename ... on Error { code message } ... on Membership { id place member } } }`,
);
const Cli_RemoveMemberMutation = graphql(
  `mutation Cli_RemoveMember($id: ID!) { removeMember(id: $id) { __typename ... on Error { code message } ... on Org { name } } }`,
);

type Orgs = ResultOf<typeof Cli_OrgsQuery>['orgs'];
type Removal = ResultOf<typeof RemovalFields>;

/** A place as owners write it: org, org/team or org/team/project. */
function splitPlace(place: string): { org: string; team?: string; project?: string } {
  const parts = place.split('/');
  if (parts.length > 3 || parts.some((p) => !p)) {
    throw new CliError(
      `a place is org, org/team or org/team/project (as owners are written: team:acme/support); "${place}" is not`,
      EXIT.usage,
    );
  }
  const [org, team, project] = parts as [string, string?, string?];
  return { org, team, project };
}

/** The id and removal preview of an org, a team or a project, by its path. */
async function findPlace(c: HangarClient, place: string, want: 'org' | 'team' | 'project') {
  const p = splitPlace(place);
  const depth = p.project ? 'project' : p.team ? 'team' : 'org';
  if (depth !== want) {
    const forms = { org: 'ORG', team: 'ORG/TEAM', project: 'ORG/TEAM/PROJECT' };
    throw new CliError(`a ${want} is named ${forms[want]}; "${place}" is not`, EXIT.usage);
  }
  const org = (await c.request(Cli_OrgRemovalQuery, { org: p.org })).org;
  if (!org) throw new CliError(`no org ${p.org}: \`hangar org ls\` lists them`, EXIT.notFound);
  if (want === 'org') return { id: org.id, removal: org.removal };
  const team = org.teams.find((t) => t.name === p.team);
  if (!team) throw new CliError(`org ${p.org} has no team ${p.team}: \`hangar org ls\` lists them`, EXIT.notFound);
  if (want === 'team') return { id: team.id, removal: team.removal };
  const project = team.projects.find((x) => x.name === p.project);
  if (!project) {
    throw new CliError(
      `team ${p.org}/${p.team} has no project ${p.project}: \`hangar org ls\` lists them`,
      EXIT.notFound,
    );
  }
  return { id: project.id, removal: project.removal };
}

/** What a removal would do, in lines a person reads before saying --yes. */
export function removalLines(r: Removal): string[] {
  const list = (label: string, items: readonly string[]) => (items.length ? [`  ${label}: ${items.join(', ')}`] : []);
  const owned = [
    ...list('collections', r.collections),
    ...list('models', r.models),
    ...list('adapters', r.adapters),
    ...list('training jobs', r.trainJobs),
  ];
  const goes = [
    ...list('teams removed with it', r.teams),
    ...list('projects removed with it', r.projects),
    ...list('memberships that end', r.members),
    ...list('API tokens that lose this access', r.apiTokens),
  ];
  return [
    ...(owned.length
      ? [`${r.what} still owns (delete these or give them another owner first):`, ...owned]
      : [`${r.what} owns nothing.`]),
    ...(goes.length ? ['Removing it also:', ...goes] : []),
  ];
}

async function remove(
  ctx: Ctx,
  cmd: Command,
  place: string,
  want: 'org' | 'team' | 'project',
  yes: boolean,
  del: (c: HangarClient, id: string) => Promise<{ __typename: string }>,
) {
  const out = ctx.out(cmd);
  const c = await ctx.client();
  const found = await findPlace(c, place, want);
  const lines = removalLines(found.removal);
  if (found.removal.blocked) {
    throw new CliError(
      `${lines.join('\n')}\nnot removed: ${found.removal.what} still owns something`,
      EXIT.conflict,
      'CONFLICT',
    );
  }
  if (!yes) {
    for (const l of lines) out.note(l);
    throw new CliError(`not removed: add --yes to remove ${found.removal.what}`, EXIT.usage);
  }
  orFail(await del(c, found.id));
  out.result(`Removed ${found.removal.what}.`, { removed: found.removal });
}

function tree(orgs: Orgs): string {
  if (!orgs.length) return 'No organisations yet: `hangar org create NAME` makes one.';
  const rows: string[][] = [];
  for (const o of orgs) {
    const direct = o.members.filter((m) => m.place === o.name).map((m) => m.member);
    rows.push(['org', o.name, direct.join(', ')]);
    for (const t of o.teams) {
      rows.push(['team', t.path, t.members.map((m) => m.member).join(', ')]);
      for (const p of t.projects) rows.push(['project', p.path, p.members.map((m) => m.member).join(', ')]);
    }
    for (const k of o.collections) rows.push(['collection', `${o.name}/${k.name}`, `owned by ${k.owner}`]);
  }
  return table(['KIND', 'NAME', 'MEMBERS'], rows);
}

export function orgCommands(program: Command, ctx: Ctx) {
  const org = program
    .command('org')
    .description('organisations, teams, projects and members: who owns and may call adapters, models and jobs');

  org
    .command('ls')
    .description('every org with its teams, projects, members and knowledge-base collections')
    .action(async (_o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const orgs = (await c.request(Cli_OrgsQuery)).orgs;
      out.result(tree(orgs), orgs);
    });

  org
    .command('create')
    .description('make an org')
    .argument('<name>')
    .action(async (name: string, _o, cmd: Command) => {
      const c = await ctx.client();
      const r = orFail((await c.request(Cli_CreateOrgMutation, { name })).createOrg);
      ctx.out(cmd).result(`Created org ${name}.`, r);
    });

  org
    .command('rename')
    .description('rename an org: what it owns stays its own')
    .argument('<org>')
    .argument('<new-name>')
    .action(async (place: string, name: string, _o, cmd: Command) => {
      const c = await ctx.client();
      const { id } = await findPlace(c, place, 'org');
      const r = orFail((await c.request(Cli_RenameOrgMutation, { id, name })).renameOrg);
      ctx.out(cmd).result(`Renamed org ${place} to ${(r as { name: string }).name}.`, r);
    });

  org
    .command('rm')
    .description('remove an org with its teams, projects and memberships (prints what it would do; needs --yes)')
    .argument('<org>')
    .option('--yes', 'remove it: the memberships end at once')
    .action((place: string, o, cmd: Command) =>
      remove(
        ctx,
        cmd,
        place,
        'org',
        Boolean(o.yes),
        async (c, id) => (await c.request(Cli_DeleteOrgMutation, { id })).deleteOrg,
      ),
    );

  for (const kind of ['team', 'project'] as const) {
    const forms = kind === 'team' ? 'ORG/TEAM' : 'ORG/TEAM/PROJECT';
    const sub = org.command(kind).description(`the ${kind}s of an org${kind === 'project' ? "'s teams" : ''}`);
    sub
      .command('add')
      .description(`make a ${kind}`)
      .argument('<path>', forms)
      .action(async (place: string, _o, cmd: Command) => {
        const p = splitPlace(place);
        const c = await ctx.client();
        if (kind === 'team') {
          if (!p.team || p.project) throw new CliError(`a team is named ORG/TEAM; "${place}" is not`, EXIT.usage);
          orFail((await c.request(Cli_CreateTeamMutation, { org: p.org, name: p.team })).createTeam);
        } else {
          if (!p.project) throw new CliError(`a project is named ORG/TEAM/PROJECT; "${place}" is not`, EXIT.usage);
          const team = `${p.org}/${p.team}`;
          orFail((await c.request(Cli_CreateProjectMutation, { team, name: p.project })).createProject);
        }
        ctx.out(cmd).result(`Created ${kind} ${place}.`, { [kind]: place });
      });
    sub
      .command('rename')
      .description(`rename a ${kind}: what it owns stays its own`)
      .argument('<path>', forms)
      .argument('<new-name>', 'the new name alone, not a path')
      .action(async (place: string, name: string, _o, cmd: Command) => {
        const c = await ctx.client();
        const { id } = await findPlace(c, place, kind);
        const r = orFail(
          kind === 'team'
            ? (await c.request(Cli_RenameTeamMutation, { id, name })).renameTeam
            : (await c.request(Cli_RenameProjectMutation, { id, name })).renameProject,
        );
        ctx.out(cmd).result(`Renamed ${kind} ${place} to ${(r as { path: string }).path}.`, r);
      });
    sub
      .command('rm')
      .description(`remove a ${kind} with its memberships (prints what it would do; needs --yes)`)
      .argument('<path>', forms)
      .option('--yes', 'remove it: the memberships end at once')
      .action((place: string, o, cmd: Command) =>
        remove(ctx, cmd, place, kind, Boolean(o.yes), async (c, id) =>
          kind === 'team'
            ? (await c.request(Cli_DeleteTeamMutation, { id })).deleteTeam
            : (await c.request(Cli_DeleteProjectMutation, { id })).deleteProject,
        ),
      );
  }

  const member = org.command('member').description('users and API tokens in an org, a team or a project');
  const who = (o: { user?: string; token?: string }) => {
    if (Boolean(o.user) === Boolean(o.token)) {
      throw new CliError(
        'a member is --user EMAIL or --token TOKEN_ID (`hangar` lists tokens on the Tokens page), one of the two',
        EXIT.usage,
      );
    }
    return o.user ? { user: o.user, apiToken: undefined } : { user: undefined, apiToken: o.token as string };
  };
  member
    .command('add')
    .description('make a user or an API token a member: it may then call what the place owns')
    .argument('<place>', 'ORG, ORG/TEAM or ORG/TEAM/PROJECT')
    .option('--user <email>', "the user's email")
    .option('--token <id>', "the API token's id")
    .action(async (place: string, o, cmd: Command) => {
      const p = splitPlace(place);
      const c = await ctx.client();
      const r = orFail(
        (
          await c.request(Cli_AddMemberMutation, {
            input: { org: p.org, team: p.team ?? null, project: p.project ?? null, ...who(o) },
          })
        ).addMember,
      );
      if (r.__typename !== 'Membership') throw new CliError(`unexpected answer ${r.__typename}`, EXIT.failed);
      ctx.out(cmd).result(`${r.member} is now a member of ${r.place}.`, r);
    });
  member
    .command('rm')
    .description('end a membership: the member may no longer call what the place owns')
    .argument('<place>', 'ORG, ORG/TEAM or ORG/TEAM/PROJECT')
    .option('--user <email>', "the user's email")
    .option('--token <id>', "the API token's id")
    .action(async (place: string, o, cmd: Command) => {
      const w = who(o);
      const p = splitPlace(place);
      const c = await ctx.client();
      const orgs = (await c.request(Cli_OrgsQuery)).orgs;
      const target = w.user ? `user:${w.user.toLowerCase()}` : `key:${w.apiToken}`;
      const found = orgs
        .find((x) => x.name === p.org)
        ?.members.find((m) => m.place === place && m.member.toLowerCase() === target);
      if (!found) {
        throw new CliError(`${target} is not a member of ${place}: \`hangar org ls\` lists the members`, EXIT.notFound);
      }
      orFail((await c.request(Cli_RemoveMemberMutation, { id: found.id })).removeMember);
      ctx.out(cmd).result(`${target} is no longer a member of ${place}.`, { removed: { place, member: target } });
    });
}
