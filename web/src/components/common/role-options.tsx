import { roles } from '../../graphql/types';

/** The three roles as a select's options, in the order of what they allow. */
export function RoleOptions() {
  return (
    <>
      {roles.map((r) => (
        <option key={r} value={r}>
          {r}
        </option>
      ))}
    </>
  );
}
