import { describe, expect, it } from 'vitest';
import { AgentConfigError, advertiseUrl, loadAgentConfig } from './config.js';

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
    // A GPU node's replicas go on its GPU unless told otherwise.
    expect(c.gpu).toBe('auto');
    expect(loadAgentConfig({ ...good, HANGAR_AGENT_GPU: 'false' }).gpu).toBe(false);
    expect(() => loadAgentConfig({ ...good, HANGAR_AGENT_GPU: 'cuda' })).toThrow(/HANGAR_AGENT_GPU.*auto .* or false/);
  });

  it('names each missing or bad variable, once, and never echoes the token', () => {
    expect(errorOf({})).toMatch(/HANGAR_URL is not set: .*HANGAR_NODE_TOKEN is not set/);
    const msg = errorOf({ HANGAR_URL: 'ftp://x', HANGAR_NODE_TOKEN: 'hgr_secret-api-token' });
    expect(msg).toContain('HANGAR_URL="ftp://x" is not accepted: an http:// or https:// URL');
    expect(msg).toContain('HANGAR_NODE_TOKEN=(hidden) is not accepted: a node token starting hgn_');
    expect(msg).not.toContain('secret-api-token');
    expect(msg.match(/HANGAR_URL/g)).toHaveLength(1);
  });

  it('reads llama-server and the engines’ deadline, and says what is wrong with them', () => {
    expect(loadAgentConfig(good)).toMatchObject({ llamaServer: undefined, engineReadyMs: undefined });
    const c = loadAgentConfig({
      ...good,
      HANGAR_AGENT_LLAMA_SERVER: ' /opt/llama.cpp/bin/llama-server  -ngl 99 ',
      HANGAR_AGENT_ENGINE_READY_MS: '900000',
    });
    expect(c.llamaServer).toEqual(['/opt/llama.cpp/bin/llama-server', '-ngl', '99']);
    expect(c.engineReadyMs).toBe(900_000);
    expect(errorOf({ ...good, HANGAR_AGENT_LLAMA_SERVER: '"/opt/my dir/llama-server"' })).toMatch(
      /HANGAR_AGENT_LLAMA_SERVER=.* is not accepted: words split on spaces, without quotes/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_ENGINE_READY_MS: '10' })).toMatch(
      /HANGAR_AGENT_ENGINE_READY_MS="10" is not accepted: at least 1000/,
    );
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

  it('listens on loopback by default, and reads HANGAR_AGENT_LISTEN and HANGAR_AGENT_ADVERTISE_URL', () => {
    const plain = loadAgentConfig(good);
    expect(plain.listen).toEqual({ host: '127.0.0.1', port: 0 });
    expect(plain.advertiseUrl).toBeUndefined();
    const node = loadAgentConfig({
      ...good,
      HANGAR_AGENT_LISTEN: '0.0.0.0:8080',
      HANGAR_AGENT_ADVERTISE_URL: 'http://10.0.0.5:8080/',
    });
    expect(node.listen).toEqual({ host: '0.0.0.0', port: 8080 });
    expect(node.advertiseUrl).toBe('http://10.0.0.5:8080/v1');
    expect(loadAgentConfig({ ...good, HANGAR_AGENT_LISTEN: '[::]:9000' }).listen).toEqual({ host: '::', port: 9000 });
    expect(loadAgentConfig({ ...good, HANGAR_AGENT_ADVERTISE_URL: 'https://gpu-1.lan/v1' }).advertiseUrl).toBe(
      'https://gpu-1.lan/v1',
    );
  });

  it('says what HANGAR_AGENT_LISTEN and HANGAR_AGENT_ADVERTISE_URL accept', () => {
    expect(errorOf({ ...good, HANGAR_AGENT_LISTEN: '8080' })).toMatch(
      /HANGAR_AGENT_LISTEN="8080" is not accepted: host:port such as 0\.0\.0\.0:8080/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_LISTEN: '0.0.0.0:70000' })).toMatch(/HANGAR_AGENT_LISTEN=.*host:port/);
    expect(errorOf({ ...good, HANGAR_AGENT_ADVERTISE_URL: '10.0.0.5:8080' })).toMatch(
      /HANGAR_AGENT_ADVERTISE_URL="10.0.0.5:8080" is not accepted: an http:\/\/ URL such as/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_ADVERTISE_URL: 'http://k:secret@10.0.0.5:8080' })).toMatch(
      /without user:password@/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_ADVERTISE_URL: 'http://10.0.0.5:8080/openai' })).toMatch(
      /serves OpenAI under \/v1/,
    );
    expect(errorOf({ ...good, HANGAR_AGENT_ADVERTISE_URL: 'http://10.0.0.5:0/v1' })).toMatch(/a real port, not 0/);
  });

  it('derives the advertised URL from the bound address, and a network address for a wildcard', () => {
    const nic = { eth0: [{ family: 'IPv4', internal: false, address: '10.0.0.7' }] } as never;
    const lo = { lo: [{ family: 'IPv4', internal: true, address: '127.0.0.1' }] } as never;
    expect(advertiseUrl({ listen: { host: '127.0.0.1', port: 0 }, advertiseUrl: undefined }, 41234, nic)).toEqual({
      url: 'http://127.0.0.1:41234/v1',
    });
    expect(advertiseUrl({ listen: { host: '::1', port: 8080 }, advertiseUrl: undefined }, 8080).url).toBe(
      'http://[::1]:8080/v1',
    );
    const wild = advertiseUrl({ listen: { host: '0.0.0.0', port: 8080 }, advertiseUrl: undefined }, 8080, nic);
    expect(wild.url).toBe('http://10.0.0.7:8080/v1');
    expect(wild.note).toMatch(/HANGAR_AGENT_ADVERTISE_URL/);
    expect(advertiseUrl({ listen: { host: '0.0.0.0', port: 8080 }, advertiseUrl: undefined }, 8080, lo).note).toMatch(
      /no network address but loopback/,
    );
    expect(
      advertiseUrl({ listen: { host: '0.0.0.0', port: 8080 }, advertiseUrl: 'http://gpu-1:8080/v1' }, 8080, nic),
    ).toEqual({ url: 'http://gpu-1:8080/v1' });
  });
});
