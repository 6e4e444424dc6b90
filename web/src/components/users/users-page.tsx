import { useQuery } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { Role } from '../../graphql/types';
import { FormError } from '../common/form-error';
import { PageHeader } from '../common/page';
import { CreateUserForm } from './create-user-form';
import { UserTable, UserTable_UserFragment } from './user-table';

export const UsersPage_UsersQuery = graphql(
  `
  query UsersPage_Users {
    users {
      ...UserTable_User
    }
  }
`,
  [UserTable_UserFragment],
);

export function UsersPage({ viewer }: { viewer: { id: string; role: Role } }) {
  if (viewer.role !== 'ADMIN') {
    return (
      <section>
        <PageHeader title="Users">Managing users needs the ADMIN role; you are signed in as {viewer.role}.</PageHeader>
      </section>
    );
  }
  return <UserAdmin viewerId={viewer.id} />;
}

function UserAdmin({ viewerId }: { viewerId: string }) {
  const [{ data, fetching, error }] = useQuery({ query: UsersPage_UsersQuery });
  return (
    <section>
      <PageHeader title="Users">
        Who can sign in to the console, and with what role. A disabled user keeps their history but cannot sign in.
      </PageHeader>
      <FormError error={error} />
      {data ? (
        <UserTable users={data.users} viewerId={viewerId} />
      ) : fetching ? (
        <p className="muted">Loading…</p>
      ) : null}
      <CreateUserForm />
    </section>
  );
}
