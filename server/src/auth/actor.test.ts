import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { actorOf, describeActor, systemActor } from './actor.js';
import type { Viewer } from './viewer.js';

const user = { id: 'u1', email: 'ana@example.com', name: 'Ana', role: 'OPERATOR' as const };

describe('the actor', () => {
  it('is described one way for the audit log, whoever it is', () => {
    const viewers: [Viewer, string][] = [
      [{ kind: 'user', user, role: 'OPERATOR', sessionId: 's1' }, 'user:ana@example.com'],
      [{ kind: 'token', user, role: 'VIEWER', tokenId: 't1', tokenName: 'ci' }, 'token:ci (ana@example.com)'],
      [{ kind: 'node', node: { id: 'n1', name: 'gpu-1' } }, 'node:gpu-1'],
      [{ kind: 'system', name: 'serve job 7' }, 'system:serve job 7'],
      [{ kind: 'anonymous', reason: 'the session has ended' }, 'anonymous'],
    ];
    for (const [viewer, named] of viewers) expect(describeActor(actorOf(viewer, { requestId: 'r' }))).toBe(named);
  });

  it("keeps the edge's request id and client address, and cuts a long user agent", () => {
    const actor = actorOf(
      { kind: 'anonymous' },
      { requestId: 'req-1', clientAddress: '10.0.0.9', userAgent: `Mozilla/5.0 ${'x'.repeat(500)}` },
    );
    expect(actor.requestId).toBe('req-1');
    expect(actor.clientAddress).toBe('10.0.0.9');
    expect(actor.userAgent).toHaveLength(300);
    expect(actor.userAgent?.startsWith('Mozilla/5.0 x')).toBe(true);
    // Nothing the client did not send: a request made in-process has no address and no agent.
    expect(actorOf({ kind: 'anonymous' }, { requestId: 'req-2', userAgent: null })).toEqual({
      viewer: { kind: 'anonymous' },
      requestId: 'req-2',
    });
  });

  it('names Hangar acting on its own, under the request id that set it going', () => {
    expect(systemActor('serve job 7', 'job-7')).toEqual({
      viewer: { kind: 'system', name: 'serve job 7' },
      requestId: 'job-7',
    });
    expect(systemActor('smoke test').requestId).toMatch(/^smoke test-/);
  });
});

// Services are called by GraphQL resolvers, HTTP routes, the serve job's steps and tests alike: with an Actor.
// The GraphQL context imports every service's type, so a service that imported it back closed a circle through
// all of them (30 files before this rule), and tempted the next one to read headers or push cookies from there.
describe('the rooms', () => {
  const src = path.resolve(import.meta.dirname, '..');
  const edge = /\.(schema|http|test)\.ts$/;
  const edgeFolders = new Set(['graphql', 'schema', 'http', 'cli', 'generated']);

  function domainFiles(): string[] {
    const out: string[] = [];
    for (const folder of fs.readdirSync(src, { withFileTypes: true })) {
      if (!folder.isDirectory() || edgeFolders.has(folder.name)) continue;
      const walk = (dir: string) => {
        for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
          const p = path.join(dir, e.name);
          if (e.isDirectory()) walk(p);
          else if (e.name.endsWith('.ts') && !edge.test(e.name)) out.push(p);
        }
      };
      walk(path.join(src, folder.name));
    }
    return out;
  }

  it('no service, nor anything beside one, imports the GraphQL context or reads a request', () => {
    const files = domainFiles();
    expect(files.some((f) => f.endsWith(path.join('auth', 'auth.service.ts')))).toBe(true);
    const offenders = files.flatMap((f) => {
      const text = fs.readFileSync(f, 'utf8');
      const found: string[] = [];
      if (/from '(\.\.\/)+context\.js'/.test(text)) found.push(`${path.relative(src, f)} imports context.ts`);
      if (/\b(ctx|actor)\.(request|responseCookies|secure)\b/.test(text)) {
        found.push(`${path.relative(src, f)} reads the request or sets cookies`);
      }
      return found;
    });
    expect(offenders).toEqual([]);
  });
});
