import { describe, expect, it } from 'vitest';
import { cacheConfig, embeddedTypes } from './cache';

describe('cacheConfig', () => {
  it('stores types without an id inside their parent and keys the rest by id', () => {
    expect(embeddedTypes).toEqual(
      expect.arrayContaining([
        'Viewer',
        'PageInfo',
        'AuditEventConnection',
        'AuditEventEdge',
        'LoginPayload',
        'CreatedApiToken',
        'CreatedNode',
        'ValidationError',
        'UnauthenticatedError',
        'Gpu',
        'Mirror',
        'MirrorFamily',
        'ModelUse',
        'FetchStarted',
        'TrainJobConnection',
        'TrainJobEdge',
        'TrainJobPublished',
        'TrainDataReport',
        'TrainParam',
        'TrainMetric',
        'TrainArtifact',
        'LengthStats',
      ]),
    );
    for (const keyed of [
      'AuditEvent',
      'ApiToken',
      'User',
      'Node',
      'MirrorVersion',
      'MirrorFile',
      'TrainJob',
      'TrainEvent',
      'Query',
      'Mutation',
    ]) {
      expect(embeddedTypes).not.toContain(keyed);
    }
    expect(cacheConfig.keys?.Viewer?.({ __typename: 'Viewer' })).toBeNull();
    expect(cacheConfig.keys?.AuditEvent?.({ __typename: 'AuditEvent', id: '42' })).toBe('42');
    // Ids the registry gives are only unique within a repository (FileSet) or one query's arguments.
    for (const view of ['RegistrySearch', 'RegistryModel', 'RegistryRepo', 'FileSet', 'Verdict', 'MemoryEstimate']) {
      expect(cacheConfig.keys?.[view]?.({ __typename: view, id: 'model:Q4_K_M' })).toBeNull();
    }
    expect(cacheConfig.keys?.MirrorVersion?.({ __typename: 'MirrorVersion', id: 'qwen3-8b/Q4_K_M' })).toBe(
      'qwen3-8b/Q4_K_M',
    );
  });
});
