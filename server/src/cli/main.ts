import { Command, CommanderError } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, type ExitCode } from './exit-codes.js';
import { fleetCommands } from './fleet.js';
import { kbCommands } from './kb.js';
import { limitsCommands } from './limits.js';
import { loginCommand } from './login.js';
import { mirrorCommands } from './mirror.js';
import { orgCommands } from './org.js';
import { output } from './output.js';
import { pricesCommands } from './prices.js';
import { serveCommands } from './serve.js';
import { connect } from './session.js';
import { trainCommands } from './train.js';
import { usageCommand } from './usage.js';

// `hangar <command>`: the CLI for scripts and terminals (docs/cli.md). Every failure ends as one line on stderr
// and an exit code from exit-codes.ts, never a stack trace; --json makes stdout what a script parses.

export async function runCli(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<ExitCode> {
  let code: ExitCode = EXIT.ok;
  let json = false;
  const program = new Command('hangar')
    .description('Hangar from a terminal: the mirror, the registry, serving, training and the fleet')
    .option('--json', 'print JSON for scripts (one document per line) instead of tables and progress bars')
    .showHelpAfterError('(`hangar --help` lists the commands)')
    .exitOverride()
    .configureOutput({ writeErr: (s) => process.stderr.write(s) });
  program.hook('preAction', (_p, action) => {
    json = Boolean(action.optsWithGlobals().json);
  });
  const ctx: Ctx = {
    env,
    client: () => connect(env),
    out: (cmd) => output(Boolean(cmd.optsWithGlobals().json)),
    exit: (c) => {
      code = c;
    },
  };
  loginCommand(program, ctx);
  mirrorCommands(program, ctx);
  fleetCommands(program, ctx);
  serveCommands(program, ctx);
  trainCommands(program, ctx);
  limitsCommands(program, ctx);
  usageCommand(program, ctx);
  pricesCommands(program, ctx);
  orgCommands(program, ctx);
  kbCommands(program, ctx);
  // Commander's own "unknown option" and friends: a usage error, like ours.
  for (const c of allCommands(program)) c.exitOverride();

  try {
    await program.parseAsync(argv, { from: 'user' });
  } catch (err) {
    if (err instanceof CommanderError)
      return err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.exitCode === 0
        ? EXIT.ok
        : EXIT.usage;
    if (err instanceof CliError) {
      if (json)
        process.stdout.write(`${JSON.stringify({ error: { code: err.code ?? null, message: err.message } })}\n`);
      process.stderr.write(`hangar: ${err.message}\n`);
      return err.exitCode;
    }
    process.stderr.write(`hangar: unexpected failure: ${(err as Error).stack ?? String(err)}\n`);
    return EXIT.failed;
  }
  return code;
}

function allCommands(c: Command): Command[] {
  return [c, ...c.commands.flatMap(allCommands)];
}
