import { createRootRouteWithContext, Link, Outlet } from '@tanstack/react-router';
import { type Client, CombinedError } from 'urql';
import { describeError } from '../components/common/form-error';

export type RouterContext = { client: Client };

export const Route = createRootRouteWithContext<RouterContext>()({
  component: Outlet,
  notFoundComponent: () => (
    <main className="standalone">
      <h1>Not found</h1>
      <p>
        There is no page at this address. <Link to="/mirror">Go to the mirror</Link>.
      </p>
    </main>
  ),
  errorComponent: ({ error, reset }) => (
    <main className="standalone">
      <h1>Something went wrong</h1>
      <p role="alert" className="form-error">
        {error instanceof CombinedError ? describeError(error) : error instanceof Error ? error.message : String(error)}
      </p>
      <button type="button" className="button" onClick={reset}>
        Try again
      </button>
    </main>
  ),
});
