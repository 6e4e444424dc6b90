import { afterEach, describe, expect, it, vi } from 'vitest';
import { AppLayout_ViewerQuery } from '../components/layout/app-layout';
import { makeClient } from './client';

afterEach(() => {
  vi.unstubAllGlobals();
  // biome-ignore lint/suspicious/noDocumentCookie: the test sets the cookie the server would set.
  document.cookie = 'hangar_csrf=; max-age=0';
});

describe('makeClient', () => {
  it('sends the CSRF cookie as x-hangar-csrf with every request, read when the request is sent', async () => {
    const fetch = vi.fn(
      async () =>
        new Response(JSON.stringify({ data: { viewer: null } }), { headers: { 'content-type': 'application/json' } }),
    );
    vi.stubGlobal('fetch', fetch);
    const client = makeClient('http://hangar.test');

    // biome-ignore lint/suspicious/noDocumentCookie: the test sets the cookie the server would set.
    document.cookie = 'hangar_csrf=first-token';
    await client.query(AppLayout_ViewerQuery, {}).toPromise();
    // biome-ignore lint/suspicious/noDocumentCookie: signing in again replaces it.
    document.cookie = 'hangar_csrf=second-token';
    await client.query(AppLayout_ViewerQuery, {}, { requestPolicy: 'network-only' }).toPromise();

    expect(fetch).toHaveBeenCalledTimes(2);
    const [[url, first], [, second]] = fetch.mock.calls as unknown as [[string, RequestInit], [string, RequestInit]];
    expect(url).toBe('http://hangar.test/graphql');
    expect(first.method).toBe('POST');
    expect(new Headers(first.headers).get('x-hangar-csrf')).toBe('first-token');
    expect(new Headers(second.headers).get('x-hangar-csrf')).toBe('second-token');
  });

  it('sends no CSRF header before anyone has signed in', async () => {
    const fetch = vi.fn(
      async () =>
        new Response(JSON.stringify({ data: { viewer: null } }), { headers: { 'content-type': 'application/json' } }),
    );
    vi.stubGlobal('fetch', fetch);
    await makeClient('http://hangar.test').query(AppLayout_ViewerQuery, {}).toPromise();
    const [[, init]] = fetch.mock.calls as unknown as [[string, RequestInit]];
    expect(new Headers(init.headers).has('x-hangar-csrf')).toBe(false);
  });
});
