import { readFileSync } from 'node:fs';

// `pnpm agent` under a supervisor: the supervisor's SIGTERM reaches pnpm, which does not pass it on, and the agent
// went on as an orphan, holding the GPU and its replicas with nobody to stop it. So the agent also stops when the
// process that started it goes away, as it would on SIGTERM: it tells the control plane it is leaving first.

/** The parent's pid as the kernel has it now; process.ppid is only the one at start. */
function currentParent(): number | undefined {
  try {
    // /proc/self/stat: "pid (comm) state ppid …"; comm may hold spaces and parentheses, so read after the last ')'.
    const stat = readFileSync('/proc/self/stat', 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return undefined;
  }
}

/**
 * Calls `gone` once when the agent's parent exits (the agent is then adopted by another process). Nothing is
 * watched when the parent is init (pid 1: a container's entrypoint, or systemd running the agent itself) or where
 * there is no /proc to ask. Answers a function that stops watching.
 */
export function watchParent(gone: () => void, intervalMs = 1000): () => void {
  const parent = currentParent();
  if (parent === undefined || !Number.isFinite(parent) || parent <= 1) return () => {};
  const timer = setInterval(() => {
    const now = currentParent();
    if (now !== undefined && now !== parent) {
      clearInterval(timer);
      gone();
    }
  }, intervalMs);
  // The watch alone keeps nothing running.
  timer.unref();
  return () => clearInterval(timer);
}
