import os from 'node:os';
import { graphql } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { HangarClient, normalizeUrl, saveCredentials } from './session.js';

const Cli_ViewerQuery = graphql(`query Cli_Viewer { viewer { role via tokenName user { email } } }`);
const Cli_LoginMutation = graphql(`
  mutation Cli_Login($email: String!, $password: String!) {
    login(email: $email, password: $password) {
      __typename
      ... on Error { code message }
      ... on LoginPayload { csrfToken user { email role } }
    }
  }
`);
const Cli_CreateTokenMutation = graphql(`
  mutation Cli_CreateToken($input: CreateApiTokenInput!) {
    createApiToken(input: $input) { __typename ... on Error { code message } ... on CreatedApiToken { secret token { name role } } }
  }
`);

export function loginCommand(program: Command, ctx: Ctx) {
  program
    .command('login')
    .description('sign in to a Hangar server and keep an API token for the other commands')
    .argument('<url>', 'the server, such as http://hangar:4000')
    .option('--token <token>', 'an API token made in the console (or HANGAR_TOKEN)')
    .option('--email <email>', 'sign in with a password instead: makes a token named after this machine')
    .option('--password-stdin', 'read the password from standard input (scripts); a terminal is asked')
    .action(async (rawUrl: string, o, cmd: Command) => {
      const out = ctx.out(cmd);
      const url = normalizeUrl(rawUrl);
      let token: string | undefined = o.token ?? ctx.env.HANGAR_TOKEN;
      if (!token) {
        if (!o.email) throw new CliError('give --token TOKEN, or --email EMAIL to sign in with a password', EXIT.usage);
        token = await tokenFromPassword(url, o.email, await readPassword(Boolean(o.passwordStdin)));
      }
      // Checked before it is kept: a typo'd token stored would make every later command fail further away.
      const { viewer } = await new HangarClient(url, token).request(Cli_ViewerQuery);
      if (!viewer) throw new CliError(`${url} does not know that token: make one in the console`, EXIT.auth);
      const file = await saveCredentials({ url, token }, ctx.env, (line) => out.note(line));
      out.result(`signed in to ${url} as ${viewer.user.email} (${viewer.role.toLowerCase()}); token kept in ${file}`, {
        url,
        email: viewer.user.email,
        role: viewer.role,
        file,
      });
    });
}

/** Signs in with the password and makes a token with the user's role; the session itself is not kept. */
async function tokenFromPassword(url: string, email: string, password: string) {
  const anonymous = new HangarClient(url, '');
  const { data, headers } = await anonymous.send(Cli_LoginMutation, { email, password });
  const login = orFail(data.login);
  if (login.__typename !== 'LoginPayload') throw new CliError(`unexpected answer ${login.__typename}`, EXIT.failed);
  const cookie = headers
    .getSetCookie()
    .map((c) => c.split(';')[0])
    .join('; ');
  const created = orFail(
    (
      await anonymous.request(
        Cli_CreateTokenMutation,
        { input: { name: `cli-${os.hostname()}-${new Date().toISOString().slice(0, 10)}`, role: login.user.role } },
        { cookie, 'x-hangar-csrf': login.csrfToken },
      )
    ).createApiToken,
  );
  if (created.__typename !== 'CreatedApiToken')
    throw new CliError(`unexpected answer ${created.__typename}`, EXIT.failed);
  return created.secret;
}

async function readPassword(fromStdin: boolean) {
  if (fromStdin || !process.stdin.isTTY) {
    const chunks: Buffer[] = [];
    for await (const c of process.stdin) chunks.push(c as Buffer);
    const pw = Buffer.concat(chunks)
      .toString('utf8')
      .replace(/\r?\n$/, '');
    if (!pw) throw new CliError('no password on standard input', EXIT.usage);
    return pw;
  }
  const readline = await import('node:readline/promises');
  const rl = readline.createInterface({ input: process.stdin, output: process.stderr, terminal: true });
  // Not echoed: readline writes what is typed through _writeToOutput, which this replaces for the answer.
  const quiet = rl as unknown as { _writeToOutput: (s: string) => void };
  process.stderr.write('password: ');
  quiet._writeToOutput = () => {};
  try {
    return await rl.question('');
  } finally {
    rl.close();
    process.stderr.write('\n');
  }
}
