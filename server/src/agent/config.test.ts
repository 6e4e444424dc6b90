import { describe, expect, it } from 'vitest';
import { AgentConfigError, loadAgentConfig } from './config.js';

const good = { HANGAR_URL: 'http://127.0.0.1:4000/', HANGAR_NODE_TOKEN: 'hgn_abc' };

function errorOf(env: Record<string, string>) {
  try {
    loadAgentConfig(env);
  } catch (err) {
    expect(err).toBeInstanceOf(AgentConfigError);
    return (err as Error).message;
  }
  throw new Error('expected a config error');
}

describe('agent config', () => {
  it('reads defaults and the GPU list', () => {
    const c = loadAgentConfig({
      ...good,
      HANGAR_AGENT_GPUS:
        '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000},{"name":"A10","totalMiB":23028,"freeMiB":1}]',
      HANGAR_AGENT_VLLM_COMMAND: '  /opt/bin/serve-vllm  --port 8001 ',
      HANGAR_AGENT_DIR: '',
    });
    expect(c.url).toBe('http://127.0.0.1:4000');
    expect(c.heartbeatMs).toBe(5000);
    expect(c.dir).toMatch(/agent-data$/);
    expect(c.gpus).toEqual([
      { index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 },
      { index: 1, name: 'A10', totalMiB: 23028, freeMiB: 1 },
    ]);
    expect(c.vllmCommand).toEqual(['/opt/bin/serve-vllm', '--port', '8001']);
  });

  it('names each missing or bad variable, once, and never echoes the token', () => {
    expect(errorOf({})).toMatch(/HANGAR_URL is not set: .*HANGAR_NODE_TOKEN is not set/);
    const msg = errorOf({ HANGAR_URL: 'ftp://x', HANGAR_NODE_TOKEN: 'hgr_secret-api-token' });
    expect(msg).toContain('HANGAR_URL="ftp://x" is not accepted: an http:// or https:// URL');
    expect(msg).toContain('HANGAR_NODE_TOKEN=(hidden) is not accepted: a node token starting hgn_');
    expect(msg).not.toContain('secret-api-token');
    expect(msg.match(/HANGAR_URL/g)).toHaveLength(1);
  });

  it('says what is wrong with HANGAR_AGENT_GPUS and the heartbeat', () => {
    expect(errorOf({ ...good, HANGAR_AGENT_GPUS: '[{name:' })).toMatch(
      /HANGAR_AGENT_GPUS="\[\{name:" is not accepted: JSON such as \[\{"name":"RTX 4090"/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":-1,"freeMiB":0}]' })).toMatch(
      /HANGAR_AGENT_GPUS=.* is not accepted \(at 0\.totalMiB\): MiB, 0 or more/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_GPUS: '{"name":"x"}' })).toMatch(/HANGAR_AGENT_GPUS=.*a JSON array/);
    expect(errorOf({ ...good, HANGAR_AGENT_HEARTBEAT_MS: 'soon' })).toMatch(
      /HANGAR_AGENT_HEARTBEAT_MS="soon" is not accepted: milliseconds between heartbeats/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_HEARTBEAT_MS: '120000' })).toMatch(
      /HANGAR_AGENT_HEARTBEAT_MS=.*at most 60000/,
    );
  });
});
