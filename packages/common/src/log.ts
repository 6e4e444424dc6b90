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

function errorReplacer(_key: string, value: unknown) {
  // A bundle's frames name the TypeScript they were built from (stack-source.ts).
  if (value instanceof Error)
    return { name: value.name, message: value.message, stack: value.stack && sourceMappedStack(value.stack) };
  if (typeof value === 'bigint') return value.toString();
  return value;
}
