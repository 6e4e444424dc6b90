import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from './config.js';

describe('config', () => {
  it('starts with nothing set', () => {
    const c = loadConfig({});
    expect(c.port).toBe(4000);
    expect(c.host).toBe('127.0.0.1');
    expect(c.dataDir).toMatch(/\/data$/);
    expect(c.databaseUrl).toBeUndefined();
    expect(c.hubUrl).toBe('https://huggingface.co');
    // A mirror that serves weights to anyone who reaches the port is opted into, not the default.
    expect(c.mirrorRequireToken).toBe(true);
    expect(loadConfig({ HANGAR_MIRROR_REQUIRE_TOKEN: 'false' }).mirrorRequireToken).toBe(false);
  });

  it('keeps /hf to what is mirrored unless HANGAR_HF_PULL_THROUGH=on, and refuses other words', () => {
    expect(loadConfig({}).hfPullThrough).toBe(false);
    expect(loadConfig({ HANGAR_HF_PULL_THROUGH: 'on' }).hfPullThrough).toBe(true);
    expect(loadConfig({ HANGAR_HF_PULL_THROUGH: 'off' }).hfPullThrough).toBe(false);
    expect(() => loadConfig({ HANGAR_HF_PULL_THROUGH: 'yes' })).toThrow(
      /HANGAR_HF_PULL_THROUGH="yes" is not accepted: off or on/,
    );
  });

  it('treats an empty variable as unset', () => {
    expect(loadConfig({ PORT: '' }).port).toBe(4000);
  });

  it('turns the registry off with HANGAR_HUB_URL=off or empty, and refuses anything else that is not a URL', () => {
    expect(loadConfig({ HANGAR_HUB_URL: 'off' }).hubUrl).toBeNull();
    // Empty is off here, not unset: falling back to huggingface.co would bring back a search box that times out.
    expect(loadConfig({ HANGAR_HUB_URL: '' }).hubUrl).toBeNull();
    expect(loadConfig({ HANGAR_HUB_URL: 'http://hub.internal:8080/' }).hubUrl).toBe('http://hub.internal:8080');
    expect(() => loadConfig({ HANGAR_HUB_URL: 'nowhere' })).toThrow(
      /HANGAR_HUB_URL="nowhere" is not accepted: the registry's http:\/\/ or https:\/\/ URL.*or off/,
    );
  });

  it('names each bad variable and what it accepts', () => {
    const attempt = () => loadConfig({ PORT: 'eighty', DATABASE_URL: 'mysql://x', HANGAR_PUBLIC_URL: 'ftp://x' });
    expect(attempt).toThrow(ConfigError);
    expect(attempt).toThrow(/PORT="eighty" is not accepted: a port number/);
    expect(attempt).toThrow(
      /DATABASE_URL="mysql:\/\/x" is not accepted: a postgres:\/\/ or postgresql:\/\/ connection URL/,
    );
    expect(attempt).toThrow(/HANGAR_PUBLIC_URL="ftp:\/\/x" is not accepted: an http:\/\/ or https:\/\/ URL/);
  });

  it('refuses a port out of range and a short admin password', () => {
    expect(() => loadConfig({ PORT: '70000' })).toThrow(/PORT="70000" is not accepted: from 0 to 65535/);
    expect(() => loadConfig({ HANGAR_ADMIN_PASSWORD: 'short' })).toThrow(
      /HANGAR_ADMIN_PASSWORD="short" is not accepted: at least 12 characters/,
    );
  });

  it('reads HANGAR_FETCH_ALLOW as a list of names and networks, and names an entry that is neither', () => {
    expect(loadConfig({}).fetchAllow).toEqual([]);
    expect(loadConfig({ HANGAR_FETCH_ALLOW: ' files.internal, 10.0.0.0/8 ,fd00::/8,' }).fetchAllow).toEqual([
      'files.internal',
      '10.0.0.0/8',
      'fd00::/8',
    ]);
    expect(() => loadConfig({ HANGAR_FETCH_ALLOW: '10.0.0.0/8,http://files.internal/' })).toThrow(
      /HANGAR_FETCH_ALLOW="10\.0\.0\.0\/8,http:\/\/files\.internal\/" is not accepted: a comma-separated list of host names and networks: "http:\/\/files\.internal\/" is neither a host name, an address nor a network/,
    );
  });

  it("reads the mirror's give-up deadline as a duration and its bandwidth as a rate, naming what is accepted", () => {
    const c = loadConfig({});
    expect([c.mirrorGiveUpAfterMs, c.mirrorRetryMaxMs, c.mirrorBandwidth]).toEqual([6 * 3_600_000, 60_000, null]);
    expect(loadConfig({ HANGAR_MIRROR_GIVE_UP_AFTER: '1h30m' }).mirrorGiveUpAfterMs).toBe(5_400_000);
    expect(loadConfig({ HANGAR_MIRROR_GIVE_UP_AFTER: '90' }).mirrorGiveUpAfterMs).toBe(90_000);
    expect(() => loadConfig({ HANGAR_MIRROR_GIVE_UP_AFTER: 'soon' })).toThrow(
      /HANGAR_MIRROR_GIVE_UP_AFTER="soon" is not accepted: a duration such as 6h or 90m/,
    );
    expect(loadConfig({ HANGAR_MIRROR_BANDWIDTH: '50MB/s' }).mirrorBandwidth).toBe(50_000_000);
    expect(loadConfig({ HANGAR_MIRROR_BANDWIDTH: '800KiB/s' }).mirrorBandwidth).toBe(819_200);
    expect(loadConfig({ HANGAR_MIRROR_BANDWIDTH: 'off' }).mirrorBandwidth).toBeNull();
    expect(() => loadConfig({ HANGAR_MIRROR_BANDWIDTH: '10' })).toThrow(/at least 64KiB\/s/);
  });
});
