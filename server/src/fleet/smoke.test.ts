import { freePort } from '@hangar/common/free-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { endpointProblem, SMOKE_MAX_TOKENS, smokeTest } from './smoke.js';

// The control plane's smoke test through a replica's endpoint, with the official OpenAI client, against a
// stand-in replica on a real socket (the agent's endpoint speaks the same protocol).

const KEY = 'hgk_smoke-test-key-0123456789abcdefghijkl';
let replica: StandInReplica;

beforeAll(async () => {
  replica = await startStandInReplica({ key: KEY, model: 'tiny' });
});
afterAll(() => replica.close());

describe('smokeTest', () => {
  it('sends one short streamed chat request with the engine key and reads the answer, speed and first token', async () => {
    const r = await smokeTest({ endpoint: replica.endpoint, engineKey: KEY, model: 'tiny' });
    expect(r).toMatchObject({ ok: true, text: ' Hello there!', completionTokens: 3 });
    if (!r.ok) return;
    expect(r.tokensPerSecond).toBeGreaterThan(0);
    expect(r.timeToFirstTokenMs).toBeGreaterThan(0);
    const sent = replica.requests.at(-1);
    expect(sent?.authorization).toBe(`Bearer ${KEY}`);
    expect(sent?.body).toMatchObject({
      model: 'tiny',
      max_tokens: SMOKE_MAX_TOKENS,
      stream: true,
      stream_options: { include_usage: true },
    });
  });

  it('fails with a clear reason for a wrong key, and never says the key', async () => {
    const wrong = 'hgk_not-the-right-key-0123456789abcdefghijkl';
    const r = await smokeTest({ endpoint: replica.endpoint, engineKey: wrong, model: 'tiny' });
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.reason).toMatch(/chat\/completions refused the engine key \(HTTP 401: Incorrect API key provided/);
    // The stand-in echoed the key it got, as OpenAI's own 401 does in part.
    expect(replica.errorBodies.at(-1)).toContain(wrong);
    expect(r.reason).not.toContain(wrong);
    expect(r.reason).toContain('(the engine key)');
  });

  it('fails with a clear reason when nothing answers on the endpoint', async () => {
    const port = await freePort();
    const r = await smokeTest({ endpoint: `http://127.0.0.1:${port}/v1`, engineKey: KEY, model: 'tiny' });
    expect(r).toEqual({
      ok: false,
      reason: expect.stringMatching(
        new RegExp(
          `could not reach http://127\\.0\\.0\\.1:${port}/v1/chat/completions \\(ECONNREFUSED\\).*HANGAR_AGENT_LISTEN`,
        ),
      ),
    });
  });

  it('says when the replica does not serve the model asked for', async () => {
    const r = await smokeTest({ endpoint: replica.endpoint, engineKey: KEY, model: 'other' });
    expect(r).toEqual({
      ok: false,
      reason: expect.stringMatching(/answered HTTP 404: The model `other` does not exist/),
    });
  });
});

describe('endpointProblem', () => {
  it('takes the base URLs nodes have, and refuses what no node serves on', () => {
    expect(endpointProblem('http://10.0.0.5:8080/v1')).toBeNull();
    expect(endpointProblem('http://127.0.0.1:41234/v1')).toBeNull();
    expect(endpointProblem('https://gpu-1.lan/v1/')).toBeNull();
    expect(endpointProblem('http://[fd00::5]:8080/v1')).toBeNull();
    expect(endpointProblem('http://169.254.169.254/v1')).toMatch(/link-local or multicast/);
    expect(endpointProblem('http://0.0.0.0:8080/v1')).toMatch(/unspecified/);
    expect(endpointProblem('http://[::]:8080/v1')).toMatch(/unspecified/);
    expect(endpointProblem('http://[fe80::1]:8080/v1')).toMatch(/link-local/);
    expect(endpointProblem('ftp://10.0.0.5/v1')).toMatch(/http:\/\/ or https:\/\//);
    expect(endpointProblem('http://u:p@10.0.0.5/v1')).toMatch(/user:password@/);
    expect(endpointProblem('http://10.0.0.5:8080/admin')).toMatch(/ending \/v1/);
    expect(endpointProblem('http://10.0.0.5:8080/v1?x=1')).toMatch(/query/);
    expect(endpointProblem('not a url')).toMatch(/is not a URL/);
  });
});
