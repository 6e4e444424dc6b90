import { sourceMappedStack } from './stack-source.js';

// One small structured logger: a line of JSON per event, so an operator can grep it and a collector can parse it.
type Level = 'debug' | 'info' | 'warn' | 'error' | 'silent';
const order: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 };

export type Logger = {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
};

export function createLogger(
  level: Level = 'info',
  write: (line: string) => void = (l) => process.stderr.write(`${l}\n`),
): Logger {
  const at = (lvl: Exclude<Level, 'silent'>) => (msg: string, fields?: Record<string, unknown>) => {
    if (order[lvl] < order[level]) return;
    write(JSON.stringify({ t: new Date().toISOString(), level: lvl, msg, ...fields }, errorReplacer));
  };
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

/**
 * A logger whose every line carries `fields` (a request's id, a download's), in front of what the line itself
 * says. Whose work a line belongs to is handed on explicitly, never kept in an AsyncLocalStorage: on Node 20 one
 * puts a promise hook on every promise of the process (db/client.ts; the gateway's added latency and the
 * subscription fan-out paid for it). Cheap: nothing is copied until a line is written.
 */
export function withFields(log: Logger, fields: Record<string, unknown>): Logger {
  return {
    debug: (msg, f) => log.debug(msg, f ? { ...fields, ...f } : fields),
    info: (msg, f) => log.info(msg, f ? { ...fields, ...f } : fields),
    warn: (msg, f) => log.warn(msg, f ? { ...fields, ...f } : fields),
    error: (msg, f) => log.error(msg, f ? { ...fields, ...f } : fields),
  };
}

function errorReplacer(_key: string, value: unknown) {
  // A bundle's frames name the TypeScript they were built from (stack-source.ts).
  if (value instanceof Error)
    return { name: value.name, message: value.message, stack: value.stack && sourceMappedStack(value.stack) };
  if (typeof value === 'bigint') return value.toString();
  return value;
}
