import { graphql } from '@hangar/common/client/graphql';
import { sleep } from '@hangar/common/retry';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';

// `hangar kb dataset`: question/answer pairs written from a knowledge-base collection's documents by a served
// model, which the server calls through its gateway as this CLI's token (so the token's access and limits apply).
// It follows the dataset's progress on stderr; Ctrl-C stops watching, not the work.

const Cli_KbCollectionsQuery = graphql(`query Cli_KbCollections($org: String!) { collections(org: $org) { id name } }`);
const Cli_CreateDatasetMutation = graphql(
  `mutation Cli_CreateDataset($input: CreateDatasetInput!) {
    createDataset(input: $input) { __typename ... on Error { code message } ... on KbDataset { id chunks } }
  }`,
);
const Cli_KbDatasetQuery = graphql(
  `query Cli_KbDataset($id: ID!) {
    kbDataset(id: $id) { id state chunks chunksDone pairs error notes dataSha256 model documents { name } }
  }`,
);

const POLL_MS = 1000;

export function kbCommands(program: Command, ctx: Ctx) {
  const kb = program.command('kb').description('knowledge-base collections: their documents turned into pairs');
  kb.command('dataset')
    .description("write question/answer pairs from a collection's documents with a served model, and follow it")
    .argument('<collection>', 'the collection as org/name')
    .requiredOption('--model <model>', 'the model (or adapter) that writes them, as /v1 names it')
    .option('--pairs-per-chunk <n>', 'pairs asked for each passage (1 to 20, default 3)', (v) => Number(v))
    .option('--chunk-chars <n>', 'the longest passage in characters (200 to 16000, default 1500)', (v) => Number(v))
    .action(async (where: string, o: { model: string; pairsPerChunk?: number; chunkChars?: number }, cmd: Command) => {
      const out = ctx.out(cmd);
      const [org, name, ...rest] = where.split('/');
      if (!org || !name || rest.length) {
        throw new CliError(`a collection is named org/name (such as acme/handbook), not "${where}"`, EXIT.usage);
      }
      const c = await ctx.client();
      const found = (await c.request(Cli_KbCollectionsQuery, { org })).collections.find((k) => k.name === name);
      if (!found) throw new CliError(`no collection ${where} (hangar org ls lists them)`, EXIT.notFound);
      const started = orFail(
        (
          await c.request(Cli_CreateDatasetMutation, {
            input: {
              collection: found.id,
              model: o.model,
              pairsPerChunk: o.pairsPerChunk ?? null,
              chunkChars: o.chunkChars ?? null,
            },
          })
        ).createDataset,
      );
      out.note(`Writing pairs from ${where} with ${o.model}: ${started.chunks} passages (dataset ${started.id}).`);
      let shown = -1;
      for (;;) {
        const d = (await c.request(Cli_KbDatasetQuery, { id: started.id })).kbDataset;
        if (!d) throw new CliError(`dataset ${started.id} is gone`, EXIT.notFound);
        if (d.chunksDone !== shown) {
          shown = d.chunksDone;
          out.note(`  ${d.chunksDone}/${d.chunks} passages, ${d.pairs} pairs`);
        }
        if (d.state === 'RUNNING') {
          await sleep(POLL_MS);
          continue;
        }
        for (const n of d.notes) out.note(`  note: ${n}`);
        if (d.state === 'FAILED')
          throw new CliError(`the dataset failed: ${d.error ?? 'no reason given'}`, EXIT.failed);
        out.result(
          `Wrote ${d.pairs} pairs from ${d.documents.length} documents with ${d.model}: data sha256 ${d.dataSha256}. A training job takes them as createTrainJob(input: { dataSha256: "${d.dataSha256}", … }).`,
          d,
        );
        return;
      }
    });
}
