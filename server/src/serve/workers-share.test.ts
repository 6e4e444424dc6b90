import { describe, expect, it } from 'vitest';
import { loadConfig } from '../config.js';
import { workerShare } from './workers-share.js';

describe('each worker’s share of the limits', () => {
  const config = loadConfig({
    HANGAR_DATA_DIR: '/tmp/hangar-share',
    HANGAR_MAX_CONNECTIONS: '1001',
    HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '10',
    HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER: '40',
    HANGAR_MIRROR_BANDWIDTH: '10MB',
  });

  it('divides what connections spread over, rounded up, so the workers together keep to the setting', () => {
    const share = workerShare(config, 2);
    expect(share.maxConnections).toBe(501);
    expect(share.maxConnectionsPerAddress).toBe(5);
    expect((share.mirrorBandwidth ?? 0) * 2).toBeLessThanOrEqual(config.mirrorBandwidth ?? 0);
    expect(workerShare(config, 1)).toBe(config);
  });

  it('leaves subscriptions per caller whole: a tab’s one WebSocket carries them all to one worker', () => {
    expect(workerShare(config, 4).maxSubscriptionsPerCaller).toBe(40);
  });
});
