import { graphql } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import OpenAI from 'openai';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { bytes, table } from './format.js';

// The read-mostly commands: the registry (the Hub, through Hangar), the catalog, the nodes, and a chat through
// the gateway.

const Cli_RegistrySearchQuery = graphql(`
  query Cli_RegistrySearch($query: String, $first: Int) {
    registrySearch(query: $query, first: $first) {
      __typename
      ... on Error { code message }
      ... on RegistrySearch { nodes { id downloads likes gated hasGguf lastModified } hasNextPage }
    }
  }
`);
const Cli_RegistryRepoQuery = graphql(`
  query Cli_RegistryRepo($id: String!, $revision: String) {
    registryRepo(id: $id, revision: $revision) {
      __typename
      ... on Error { code message }
      ... on RegistryRepo {
        id revision shortRevision gated noAccess architecture url
        sets { id kind format quant model version shardCount totalBytes complete verdict { servable reason } fits { summary } }
      }
    }
  }
`);
const Cli_ModelsQuery = graphql(`
  query Cli_Models {
    models { name mode modeMessage engine source wantedReplicas replicas { state node { name } } adapters { name } }
  }
`);
const Cli_NodesQuery = graphql(`
  query Cli_Nodes {
    nodes { name online lastSeenAt agentVersion diskFreeBytes gpus { index name totalMiB freeMiB } replicas { state model { name } } }
  }
`);

export function fleetCommands(program: Command, ctx: Ctx) {
  const registry = program.command('registry').description('the Hub, as Hangar sees it (search, sets, verdicts)');
  registry
    .command('search')
    .description('search the Hub for models')
    .argument('[query]')
    .option('--first <n>', 'how many', (v) => Number(v), 20)
    .action(async (query: string | undefined, o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const r = orFail(
        (await c.request(Cli_RegistrySearchQuery, { query: query ?? null, first: o.first })).registrySearch,
      );
      if (r.__typename !== 'RegistrySearch') throw new CliError(`unexpected answer ${r.__typename}`, EXIT.failed);
      out.result(
        r.nodes.length === 0
          ? `nothing on the Hub matches "${query ?? ''}"`
          : table(
              ['REPO', 'DOWNLOADS', 'LIKES', 'GGUF', 'GATED'],
              r.nodes.map((m) => [m.id, m.downloads, m.likes, m.hasGguf ? 'yes' : '', m.gated ? 'gated' : '']),
            ),
        r.nodes,
      );
    });
  registry
    .command('show')
    .description("a repository's file sets, with whether each can be served here and fits")
    .argument('<repo>', 'OWNER/REPO')
    .option('--revision <rev>', 'a branch, tag or commit (default main)')
    .action(async (repo: string, o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const r = orFail(
        (await c.request(Cli_RegistryRepoQuery, { id: repo, revision: o.revision ?? null })).registryRepo,
      );
      if (r.__typename !== 'RegistryRepo') throw new CliError(`unexpected answer ${r.__typename}`, EXIT.failed);
      const head = `${r.id} @ ${r.shortRevision}${r.architecture ? `  ${r.architecture}` : ''}${r.noAccess ? `\n${r.noAccess}` : ''}`;
      out.result(
        `${head}\n${table(
          ['SET', 'QUANT', 'SIZE', 'SHARDS', 'SERVABLE', 'FITS'],
          r.sets.map((s) => [
            s.version,
            s.quant,
            bytes(s.totalBytes),
            s.shardCount,
            s.verdict.servable ? 'yes' : `no: ${s.verdict.reason}`,
            s.fits.summary,
          ]),
        )}`,
        r,
      );
    });

  program
    .command('models')
    .description('the catalog: what the fleet serves, and how')
    .action(async (_o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const { models } = await c.request(Cli_ModelsQuery);
      out.result(
        models.length === 0
          ? 'The catalog is empty: `hangar serve OWNER/REPO` adds a model.'
          : table(
              ['NAME', 'MODE', 'READY', 'ADAPTERS', 'STATUS'],
              models.map((m) => [
                m.name,
                m.mode.toLowerCase(),
                `${m.replicas.filter((r) => r.state === 'READY').length}/${m.wantedReplicas}`,
                m.adapters.map((a) => a.name).join(','),
                m.modeMessage,
              ]),
            ),
        models,
      );
    });

  program
    .command('nodes')
    .description('the GPU nodes, online or not, with their GPUs and replicas')
    .action(async (_o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const { nodes } = await c.request(Cli_NodesQuery);
      out.result(
        nodes.length === 0
          ? 'No nodes yet: create one in the console and start its agent with `hangar agent`.'
          : table(
              ['NAME', 'ONLINE', 'GPUS', 'FREE', 'REPLICAS'],
              nodes.map((n) => [
                n.name,
                n.online ? 'yes' : `no${n.lastSeenAt ? ` (seen ${n.lastSeenAt})` : ''}`,
                n.gpus.map((g) => g.name).join(', '),
                n.gpus.map((g) => `${g.freeMiB}/${g.totalMiB} MiB`).join(', '),
                n.replicas.map((r) => `${r.model.name}:${r.state.toLowerCase()}`).join(', '),
              ]),
            ),
        nodes,
      );
    });

  program
    .command('chat')
    .description('talk to a catalog model through the gateway (/v1), streaming the answer')
    .argument('<model>')
    .argument('[message...]', 'one message to send (default: read lines from the terminal)')
    .action(async (model: string, words: string[], _o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const openai = new OpenAI({ baseURL: `${c.url}/v1`, apiKey: c.token, maxRetries: 0 });
      const history: Turn[] = [];
      const ask = async (content: string) => {
        history.push({ role: 'user', content });
        let answer = '';
        for (;;) {
          try {
            const stream = await openai.chat.completions.create({ model, messages: history, stream: true });
            for await (const chunk of stream) {
              const piece = chunk.choices[0]?.delta?.content ?? '';
              answer += piece;
              if (!out.json) process.stdout.write(piece);
            }
            break;
          } catch (err) {
            // The conversation outgrew the model's context: forget the oldest exchange and ask again, as a
            // person would expect of a chat, rather than ending it. Only the question just asked is never dropped.
            if (!outgrewContext(err) || answer !== '' || history.length < 3) throw chatError(err, model);
            history.splice(0, 2);
            out.note(`the conversation no longer fits ${model}'s context: dropped the oldest exchange`);
          }
        }
        history.push({ role: 'assistant', content: answer });
        if (out.json) out.result('', { model, answer });
        else process.stdout.write('\n');
      };
      if (words.length > 0) return ask(words.join(' '));
      // Every line is a question, piped or typed: a readline's async iterator keeps the lines that arrive while an
      // answer streams (rl.question would lose all but the first of a pipe's lines). The prompt only on a terminal.
      const readline = await import('node:readline');
      const tty = Boolean(process.stdin.isTTY);
      const rl = readline.createInterface({ input: process.stdin, output: process.stderr, terminal: tty });
      rl.setPrompt('> ');
      if (tty) {
        out.note(`chatting with ${model}; an empty line or Ctrl-D ends it`);
        rl.prompt();
      }
      try {
        for await (const line of rl) {
          if (!line.trim()) {
            // An empty line typed at a terminal ends the chat; in a pipe it is only a blank line.
            if (tty) break;
            continue;
          }
          await ask(line);
          if (tty) rl.prompt();
        }
      } finally {
        rl.close();
      }
    });
}

type Turn = { role: 'user' | 'assistant'; content: string };

/** OpenAI's `context_length_exceeded` (Hangar's llama.cpp replicas and OpenAI), or vLLM's and llama-server's words. */
function outgrewContext(err: unknown) {
  if (!(err instanceof OpenAI.APIError) || err.status !== 400) return false;
  return (
    err.code === 'context_length_exceeded' ||
    err.type === 'exceed_context_size_error' ||
    /maximum context length|exceeds the available context size/i.test(err.message)
  );
}

function chatError(err: unknown, model: string) {
  if (err instanceof OpenAI.APIError) {
    const status = err.status ?? 0;
    const code =
      status === 401 || status === 403
        ? EXIT.auth
        : status === 404
          ? EXIT.notFound
          : status === 0 || status >= 500
            ? EXIT.unreachable
            : EXIT.failed;
    return new CliError(`${model}: ${err.message}`, code);
  }
  return new CliError(`${model}: ${(err as Error).message}`, EXIT.unreachable);
}
