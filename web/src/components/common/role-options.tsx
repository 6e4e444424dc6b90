import { roles } from '../../graphql/types';
import { LabelledControl } from './form-parts';

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

/**
 * The Role field of a create form, read with FormData as `role`. It starts at VIEWER, the least a new user or token
 * can be: more is chosen on purpose.
 */
export function RoleField() {
  return (
    <LabelledControl label="Role">
      <select name="role" defaultValue="VIEWER">
        <RoleOptions />
      </select>
    </LabelledControl>
  );
}
