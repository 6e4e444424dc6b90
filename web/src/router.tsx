import { createRouter, type RouterHistory } from '@tanstack/react-router';
import type { Client } from 'urql';
import { routeTree } from './routeTree.gen';

export function makeRouter(client: Client, history?: RouterHistory) {
  return createRouter({
    routeTree,
    history,
    context: { client },
    defaultPreload: 'intent',
    // Pages read through urql's cache; the router keeps no data of its own.
    defaultPreloadStaleTime: 0,
    scrollRestoration: true,
  });
}

declare module '@tanstack/react-router' {
  interface Register {
    router: ReturnType<typeof makeRouter>;
  }
}
