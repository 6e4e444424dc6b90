import { graphql, type ResultOf } from '../../graphql/graphql';

// What removing an org, a team or a project would do, as the server works it out (OrgRemoval): asked when the
// admin clicks Remove, so the consequences are read before the red button, not learnt after it.

const OrgRemoval_Fragment = graphql(`
  fragment OrgRemoval_Fields on OrgRemoval {
    what blocked collections models adapters trainJobs teams projects members apiTokens
  }
`);

export const OrgsPage_RemovalQuery = graphql(
  `
  query OrgsPage_Removal {
    orgs {
      id
      removal { ...OrgRemoval_Fields }
      teams {
        id
        removal { ...OrgRemoval_Fields }
        projects { id removal { ...OrgRemoval_Fields } }
      }
    }
  }
`,
  [OrgRemoval_Fragment],
);

type Removal = ResultOf<typeof OrgRemoval_Fragment>;

function Items({ label, items }: { label: string; items: readonly string[] }) {
  if (!items.length) return null;
  return (
    <li>
      {label}: <span className="mono">{items.join(', ')}</span>
    </li>
  );
}

export function OrgRemovalPreview({ removal }: { removal: Removal }) {
  const owns = [...removal.collections, ...removal.models, ...removal.adapters, ...removal.trainJobs].length > 0;
  const goes = [...removal.teams, ...removal.projects, ...removal.members].length > 0;
  return (
    <div className="removal-preview" data-testid="removal-preview">
      {owns ? (
        <>
          <p role="alert" className="form-error">
            Refused while {removal.what} owns these: delete them or give them another owner first.
          </p>
          <ul>
            <Items label="Collections" items={removal.collections} />
            <Items label="Models" items={removal.models} />
            <Items label="Adapters" items={removal.adapters} />
            <Items label="Training jobs" items={removal.trainJobs} />
          </ul>
        </>
      ) : (
        <p className="hint">{removal.what} owns no collection, model, adapter or training job.</p>
      )}
      {goes ? (
        <>
          <p className="hint">Removing it also removes or ends:</p>
          <ul>
            <Items label="Teams" items={removal.teams} />
            <Items label="Projects" items={removal.projects} />
            <Items label="Memberships" items={removal.members} />
            <Items label="API tokens that lose this access" items={removal.apiTokens} />
          </ul>
        </>
      ) : (
        <p className="hint">Nobody is a member of it: removing it changes what no one may call.</p>
      )}
    </div>
  );
}
