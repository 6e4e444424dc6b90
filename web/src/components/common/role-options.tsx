import { type Role, roles } from '../../graphql/types';
import { LabelledControl } from './form-parts';

/**
 * The roles as a select's options, in the order of what they allow; with `upTo`, only those up to it: what may be
 * given by someone holding that role (offering more, only for the server to refuse it, wastes a person's time).
 */
export function RoleOptions({ upTo }: { upTo?: Role } = {}) {
  const most = upTo ? roles.indexOf(upTo) : roles.length - 1;
  return (
    <>
      {roles.slice(0, most + 1).map((r) => (
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
export function RoleField({ upTo }: { upTo?: Role } = {}) {
  return (
    <LabelledControl label="Role">
      <select name="role" defaultValue="VIEWER">
        <RoleOptions upTo={upTo} />
      </select>
    </LabelledControl>
  );
}
