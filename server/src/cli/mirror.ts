import path from 'node:path';
import { graphql, type ResultOf } from '@hangar/common/client/graphql';
import type { Command } from 'commander';
import type { Ctx } from './context.js';
import { CliError, EXIT, orFail } from './exit-codes.js';
import { uploadToMirror } from './files.js';
import { bytes, table } from './format.js';
import type { Out } from './output.js';
import { ProgressBar } from './progress.js';
import type { HangarClient } from './session.js';
import { follow } from './watch.js';

const VersionFields = graphql(`
  fragment Cli_MirrorVersion on MirrorVersion {
    id model version kind state bytesDone bytesTotal bytesPerSecond etaSeconds percent fileCount verified error url
    removed retry { attempt nextAt reason }
    files { file state bytesDone bytesTotal error }
  }
`);

const Cli_MirrorListQuery = graphql(`query Cli_MirrorList { mirror { versions { ...Cli_MirrorVersion } } }`, [
  VersionFields,
]);
const Cli_MirrorVersionQuery = graphql(
  `query Cli_MirrorVersion($model: String!, $version: String!) {
    mirrorVersion(model: $model, version: $version) { ...Cli_MirrorVersion }
  }`,
  [VersionFields],
);
const Cli_MirrorPullMutation = graphql(
  `mutation Cli_MirrorPull($model: String!, $version: String!, $sources: [MirrorSourceInput!]!, $force: Boolean, $fetchAnyway: Boolean) {
    fetchToMirror(model: $model, version: $version, sources: $sources, force: $force, fetchAnyway: $fetchAnyway) {
      __typename
      ... on Error { code message }
      ... on ValidationError { field }
      ... on FetchStarted { message started alreadyPresent alreadyArriving version { ...Cli_MirrorVersion } }
    }
  }`,
  [VersionFields],
);
const Cli_MirrorRemoveMutation = graphql(`
  mutation Cli_MirrorRemove($model: String!, $version: String!, $force: Boolean) {
    removeMirrorVersion(model: $model, version: $version, force: $force) {
      __typename
      ... on Error { code message }
      ... on RemovedMirrorVersion { model version files bytes }
    }
  }
`);
const Cli_MirrorVersionChangedSubscription = graphql(
  `subscription Cli_MirrorVersionChanged($model: String!, $version: String!) {
    mirrorVersionChanged(model: $model, version: $version) { ...Cli_MirrorVersion }
  }`,
  [VersionFields],
);

type Version = ResultOf<typeof VersionFields>;

const ENDED = new Set(['PRESENT', 'FAILED', 'CANCELLED', 'PAUSED']);

export function mirrorCommands(program: Command, ctx: Ctx) {
  const mirror = program.command('mirror').description('the mirror: what it holds, fetching into it, removing');

  mirror
    .command('ls')
    .description('every version in the mirror, with its state and size')
    .action(async (_o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const data = await c.request(Cli_MirrorListQuery);
      const versions = data.mirror.versions;
      out.result(
        versions.length === 0
          ? 'The mirror holds nothing yet: `hangar mirror pull URL…` fetches into it.'
          : table(
              ['MODEL', 'VERSION', 'STATE', 'SIZE', 'FILES', 'VERIFIED'],
              versions.map((v) => [
                v.model,
                v.version,
                v.state.toLowerCase(),
                v.bytesTotal == null ? `${bytes(v.bytesDone)} so far` : bytes(v.bytesTotal),
                v.fileCount,
                v.verified ? 'yes' : 'no',
              ]),
            ),
        versions,
      );
    });

  mirror
    .command('pull')
    .description('fetch files into the mirror as one version, and follow the download')
    .argument('<url...>', 'the files, by URL (a Hub resolve/ URL or any https:// one); shards of one model together')
    .option('--model <name>', "the mirror's model name (default: from the first file's name)")
    .option('--version <version>', 'the version (default: the Hub revision in the URL, else "1")')
    .option('--sha256 <digest...>', 'the published sha256 of each file, in order, to verify against')
    .option('--force', 'fetch files again even when present')
    .option('--fetch-anyway', 'skip the GGUF header check (an architecture the nodes do not know yet)')
    .option('--no-wait', 'start the download and return at once')
    .action(async (urls: string[], o, cmd: Command) => {
      const out = ctx.out(cmd);
      const guess = nameFromUrl(urls[0] ?? '');
      const model = o.model ?? guess.model;
      const version = o.version ?? guess.version;
      const digests: string[] = o.sha256 ?? [];
      const sources = urls.map((url, i) => ({ url, ...(digests[i] ? { sha256: digests[i] } : {}) }));
      const c = await ctx.client();
      const r = orFail(
        (
          await c.request(Cli_MirrorPullMutation, {
            model,
            version,
            sources,
            force: o.force ?? null,
            fetchAnyway: o.fetchAnyway ?? null,
          })
        ).fetchToMirror,
      );
      if (r.__typename !== 'FetchStarted') throw new CliError(`unexpected answer ${r.__typename}`, EXIT.failed);
      const started = r.version;
      out.note(r.message);
      if (!o.wait) {
        out.result(`${model}/${version}: ${started.state.toLowerCase()}`, started);
        return;
      }
      ctx.exit(await watchVersion(c, out, model, version, started));
    });

  mirror
    .command('watch')
    .description('follow a version that is arriving, until its files are present or it fails')
    .argument('<model>')
    .argument('<version>')
    .action(async (model: string, version: string, _o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const now = (await c.request(Cli_MirrorVersionQuery, { model, version })).mirrorVersion;
      if (!now)
        throw new CliError(`the mirror has no ${model}/${version}: \`hangar mirror ls\` lists it`, EXIT.notFound);
      ctx.exit(await watchVersion(c, out, model, version, now));
    });

  mirror
    .command('rm')
    .description('remove a version and its files from the mirror')
    .argument('<model>')
    .argument('<version>')
    .option('--force', 'remove it even while catalog models use it')
    .action(async (model: string, version: string, o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const r = orFail(
        (await c.request(Cli_MirrorRemoveMutation, { model, version, force: o.force ?? null })).removeMirrorVersion,
      );
      if (r.__typename !== 'RemovedMirrorVersion') throw new CliError(`unexpected answer ${r.__typename}`, EXIT.failed);
      out.result(`removed ${r.model}/${r.version}: ${r.files} files, ${bytes(r.bytes)}`, r);
    });

  mirror
    .command('import')
    .description('put a local file into the mirror (a GGUF you built, an adapter), verified by its sha256')
    .argument('<file>')
    .requiredOption('--model <model>', 'the model it is filed under')
    .requiredOption('--version <version>', 'the version it is filed under')
    .option('--name <name>', 'its name in the version (default: the file name)')
    .action(async (file: string, o, cmd: Command) => {
      const out = ctx.out(cmd);
      const c = await ctx.client();
      const name = o.name ?? path.basename(file);
      const kept = await uploadToMirror(c, file, { model: o.model, version: o.version, name });
      out.result(
        `${o.model}/${o.version}/${name}: ${bytes(kept.size)}, sha256 ${kept.sha256}${kept.url ? `; nodes fetch it at ${kept.url}` : ''}`,
        kept,
      );
    });
}

/** Follows a version with a progress bar (or, with --json, one line per change) until it has ended. */
async function watchVersion(c: HangarClient, out: Out, model: string, version: string, first: Version) {
  const bar = out.json ? undefined : new ProgressBar();
  let last = first;
  const show = (v: Version) => {
    last = v;
    if (out.json) out.result('', v);
    else
      bar?.update({
        label: `${model}/${version}`,
        done: v.bytesDone,
        total: v.bytesTotal ?? null,
        unit: 'bytes',
        rate: v.bytesPerSecond ?? null,
        etaSeconds: v.etaSeconds ?? null,
        state: v.state,
        note: v.retry ? `waiting to retry: ${v.retry.reason}` : null,
      });
    return ENDED.has(v.state) || v.removed;
  };
  const outcome = await follow({
    first,
    events: (async function* () {
      for await (const e of c.subscribe(Cli_MirrorVersionChangedSubscription, { model, version }))
        yield e.mirrorVersionChanged;
    })(),
    current: async () => (await c.request(Cli_MirrorVersionQuery, { model, version })).mirrorVersion,
    show,
    onInterrupt: () => {
      bar?.stop();
      out.note(
        `Stopped watching; the download goes on in the server. Watch it again: hangar mirror watch ${model} ${version}`,
      );
    },
  });
  bar?.stop();
  if (outcome === 'interrupted') return EXIT.interrupted;
  if (last.state === 'PRESENT') {
    if (!out.json)
      out.result(`${model}/${version}: present, ${bytes(last.bytesDone)}${last.verified ? ', verified' : ''}`, last);
    return EXIT.ok;
  }
  const why = last.error ?? last.files.find((f) => f.error)?.error ?? last.state.toLowerCase();
  out.note(`${model}/${version} ${last.state.toLowerCase()}: ${why}. Retry it with the console or fetch it again.`);
  return EXIT.failed;
}

/**
 * A model name and version from a file URL: a Hub resolve/ URL gives its revision (the commit, shortened as the
 * registry does); the model is the file's name without shard numbering and extension, in the mirror's alphabet.
 */
export function nameFromUrl(raw: string) {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new CliError(`"${raw}" is not a URL: give the file's http(s):// address`, EXIT.usage, 'VALIDATION');
  }
  const parts = u.pathname.split('/').filter(Boolean).map(decodeURIComponent);
  const at = parts.indexOf('resolve');
  const rev = at >= 0 ? parts[at + 1] : undefined;
  const file = parts.at(-1) ?? 'model';
  const model =
    file
      .replace(/\.gguf$/i, '')
      .replace(/-\d{5}-of-\d{5}$/, '')
      .replace(/[^A-Za-z0-9._-]+/g, '-')
      .replace(/^[^A-Za-z0-9]+/, '')
      .slice(0, 100) || 'model';
  const version = rev ? (/^[0-9a-f]{40}$/.test(rev) ? rev.slice(0, 7) : rev.replace(/[^A-Za-z0-9._-]+/g, '-')) : '1';
  return { model, version };
}
