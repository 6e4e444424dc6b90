import { describe, expect, it } from 'vitest';
import { withState } from './message.js';

describe('withState', () => {
  it('says the state once, whether or not the reason already starts with it', () => {
    expect(withState('STOPPED', 'stopped: no longer assigned to this node')).toBe(
      'stopped: no longer assigned to this node',
    );
    expect(withState('STOPPED', 'Stopped, as the control plane asked')).toBe('Stopped, as the control plane asked');
    expect(withState('FAILED', 'the weights could not be read')).toBe('failed: the weights could not be read');
    expect(withState('READY', null)).toBe('ready');
    expect(withState('READY', '  ')).toBe('ready');
  });
});
