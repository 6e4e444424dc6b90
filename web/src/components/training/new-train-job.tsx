import { useEffect, useId, useState } from 'react';
import { useQuery } from 'urql';
import { graphql, type ResultOf, type VariablesOf } from '../../graphql/graphql';
import { CheckField, Field, SelectField } from '../common/field';
import { FormError, FormError_RefusalFragment, refusedField } from '../common/form-error';
import { onFormSubmit, SubmitButton } from '../common/form-parts';
import { PageHeader } from '../common/page';
import { PageLink } from '../common/page-link';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import { checkParams, defaultParamValues, paramRange, paramStep, type TrainParam } from './params';
import { type TrainDataReport, uploadTrainData } from './train-data';
import { DataReport } from './train-data-report';
import { checkEvalFields, EvalFields } from './train-eval-fields';

type Options = ResultOf<typeof NewTrainJob_OptionsQuery>;
type NodeOption = Options['nodes'][number];
type ModelOption = Options['models'][number];

/** What the form offers: the catalog's models, the nodes with their GPUs' free memory, the trainer's settings. */
export const NewTrainJob_OptionsQuery = graphql(`
  query NewTrainJob_Options {
    models {
      id
      name
      engine
    }
    nodes {
      id
      name
      online
      gpus {
        index
        name
        freeMiB
        totalMiB
      }
    }
    trainParams {
      name
      about
      min
      max
      default
      whole
    }
  }
`);

export type CreateTrainJobInput = VariablesOf<typeof NewTrainJob_CreateMutation>['input'];

/**
 * Only the new job's id: its page reads the rest. (The job's `message` may be null and a refusal's may not, and
 * GraphQL refuses the two under one name in one answer.) The training list is read again through graphcache's
 * updater (graphql/cache.ts).
 */
export const NewTrainJob_CreateMutation = graphql(
  `
  mutation NewTrainJob_Create($input: CreateTrainJobInput!) {
    createTrainJob(input: $input) {
      __typename
      ... on TrainJob {
        id
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

const engineWords = { llamacpp: 'llama.cpp', vllm: 'vLLM' } as const;

const mib = (n: number) => `${n.toLocaleString('en')} MiB`;

/** The owners an operator picks from: every org, team and project by path, and the caller. */
type OwnersData = ResultOf<typeof NewTrainJob_OwnersQuery>;
export const NewTrainJob_OwnersQuery = graphql(`
  query NewTrainJob_Owners {
    viewer {
      user {
        email
      }
    }
    orgs {
      id
      name
      teams {
        id
        path
        projects {
          id
          path
        }
      }
    }
  }
`);

export function ownerChoices(d: OwnersData | null | undefined): string[] {
  if (!d) return [];
  const out: string[] = [];
  for (const o of d.orgs ?? []) {
    out.push(`org:${o.name}`);
    for (const t of o.teams) {
      out.push(`team:${t.path}`);
      for (const p of t.projects) out.push(`project:${p.path}`);
    }
  }
  if (d.viewer?.user) out.push(`user:${d.viewer.user.email}`);
  return out;
}

/**
 * "GPU 0: 20,000 MiB free of 24,564, GPU 1: …", or why the node offers none: in MiB, the unit the job's GPU
 * memory is asked in, so the two compare at a glance.
 */
export function gpusText(node: NodeOption): string {
  const gpus = node.gpus.map((g) => `GPU ${g.index}: ${mib(g.freeMiB)} free of ${g.totalMiB.toLocaleString('en')}`);
  return `${node.online ? '' : 'offline · '}${gpus.join(', ') || 'no GPU reported'}`;
}

export function NewTrainJobPage({
  onCreated,
  canChange = true,
}: {
  onCreated: (id: string) => void;
  canChange?: boolean;
}) {
  const [{ data, fetching, error }] = useQuery({
    query: NewTrainJob_OptionsQuery,
    // Free GPU memory moves: read it fresh on each visit.
    requestPolicy: 'cache-and-network',
    pause: !canChange,
  });
  return (
    <section>
      <p className="crumbs">
        <PageLink to="/training">Training</PageLink> /
      </p>
      <PageHeader title="New training job">
        Trains a LoRA adapter for a catalog model on one node's GPU, from question/answer pairs. The job waits in the
        queue until the node has the GPU memory it needs; once it is done, publish it from its page.
      </PageHeader>
      {!canChange ? (
        <p className="empty">
          Submitting a training job needs the OPERATOR role; your role can follow the jobs on the{' '}
          <PageLink to="/training">Training</PageLink> page.
        </p>
      ) : null}
      <FormError error={error} />
      {!data && fetching ? <p className="muted">Loading…</p> : null}
      {data && canChange ? (
        <NewTrainJobForm
          models={data.models}
          nodes={data.nodes}
          params={data.trainParams}
          onCreated={onCreated}
          // The settings arrive with the options: the form starts from their defaults once they are known.
          key={data.trainParams.map((p) => p.name).join(',')}
        />
      ) : null}
    </section>
  );
}

type Upload =
  | { state: 'none' }
  | { state: 'checking'; file: string }
  | { state: 'checked'; file: string; report: TrainDataReport }
  | { state: 'failed'; file: string; message: string };

/**
 * The job's form. The pairs are sent to the server as soon as a file is chosen and its report shown (pairs, size,
 * bad lines, duplicates, lengths) before anything is submitted. The trainer's settings are checked here against
 * the ranges the server gives; everything else is checked by the server, whose refusal is shown at the field it
 * names.
 */
export function NewTrainJobForm({
  models,
  nodes,
  params,
  onCreated,
  upload = uploadTrainData,
}: {
  models: ModelOption[];
  nodes: NodeOption[];
  params: TrainParam[];
  onCreated: (id: string) => void;
  upload?: (
    file: File,
    fetchImpl?: typeof fetch,
    o?: { model?: string; maxLen?: number },
  ) => ReturnType<typeof uploadTrainData>;
}) {
  const { fetching, error, refusal, run, clearRefusal } = useRefusableMutation(
    NewTrainJob_CreateMutation,
    (d) => d.createTrainJob,
  );
  const [name, setName] = useState('');
  const [model, setModel] = useState('');
  const [baseRepo, setBaseRepo] = useState('');
  const [baseRevision, setBaseRevision] = useState('');
  const [node, setNode] = useState(nodes.length === 1 ? (nodes[0]?.name ?? '') : '');
  const [gpuMiB, setGpuMiB] = useState('');
  const [owner, setOwner] = useState('');
  const [isPublic, setPublic] = useState(false);
  // Unless the operator says otherwise, the GGUF adapter is made when llama.cpp serves the model (it loads no other).
  const [gguf, setGguf] = useState<boolean | null>(null);
  const [values, setValues] = useState(() => defaultParamValues(params));
  const [dataFile, setDataFile] = useState<Upload>({ state: 'none' });
  // The share of the pairs held out of training to judge the adapter against its base (#32), and its seed.
  const [evalShare, setEvalShare] = useState('10');
  const [evalSeed, setEvalSeed] = useState('');
  // Errors found here before sending, by field; the server's refusal, which names its field too.
  const [local, setLocal] = useState<Record<string, string>>({});
  const ids = { params: useId(), owners: useId() };
  // Suggestions only: user: and key: owners other than the caller are typed (those lists are admins').
  const [owners] = useQuery({ query: NewTrainJob_OwnersQuery });
  const choices = ownerChoices(owners.data);

  const chosenModel = models.find((m) => m.name === model);
  const chosenNode = nodes.find((n) => n.name === node);
  const ggufOn = gguf ?? chosenModel?.engine === 'llamacpp';

  const [pickedFile, setPickedFile] = useState<File | undefined>(undefined);
  const maxLen = Number(values.max_len);
  const chooseFile = async (file: File | undefined) => {
    setLocal(({ data: _, ...rest }) => rest);
    setPickedFile(file);
    if (!file) return setDataFile({ state: 'none' });
    setDataFile({ state: 'checking', file: file.name });
    const answer = await upload(file, undefined, {
      model: model || undefined,
      maxLen: Number.isInteger(maxLen) && maxLen > 0 ? maxLen : undefined,
    });
    setDataFile(
      answer.ok
        ? { state: 'checked', file: file.name, report: answer.report }
        : { state: 'failed', file: file.name, message: answer.message },
    );
  };

  // Token counts are by the chosen model's tokenizer: a file already chosen is checked again for another model.
  // (Not on every max_len keystroke: the file can be 64 MiB. The report says which max_len it compared with.)
  // biome-ignore lint/correctness/useExhaustiveDependencies: only a change of model should send the file again
  useEffect(() => {
    if (pickedFile) void chooseFile(pickedFile);
  }, [model]);

  const submit = onFormSubmit(async () => {
    clearRefusal();
    const errors: Record<string, string> = {};
    const checked = checkParams(params, values);
    if (!checked.ok) for (const [k, v] of Object.entries(checked.errors)) errors[`params.${k}`] = v;
    const mib = Number(gpuMiB.trim());
    // An Int the server cannot read would fail the whole request rather than name the field: caught here.
    if (gpuMiB.trim() === '' || !Number.isInteger(mib) || mib < 1)
      errors.gpuMiB = `the GPU memory the job needs on one card, a whole number of MiB: ${gpuMiB.trim() ? JSON.stringify(gpuMiB.trim()) : 'nothing'} is not`;
    if (dataFile.state === 'none') errors.data = 'choose the pairs: a .jsonl file, one {"q": "…", "a": "…"} per line';
    else if (dataFile.state === 'checking')
      errors.data = 'the pairs are still being checked: submit once their report is shown';
    else if (dataFile.state === 'failed') errors.data = dataFile.message;
    else if (!dataFile.report.ok)
      errors.data = 'these pairs cannot be trained on (see the report): fix the file and choose it again';
    const evaluation = checkEvalFields(evalShare, evalSeed);
    if (!evaluation.ok) Object.assign(errors, evaluation.errors);
    setLocal(errors);
    if (Object.keys(errors).length || dataFile.state !== 'checked' || !checked.ok || !evaluation.ok) return;

    const outcome = await run({
      input: {
        name: name.trim(),
        model,
        baseRepo: baseRepo.trim(),
        baseRevision: baseRevision.trim() || null,
        node,
        gpuMiB: mib,
        owner: isPublic ? null : owner.trim() || null,
        public: isPublic,
        dataSha256: dataFile.report.sha256,
        params: checked.params,
        gguf: ggufOn,
        evalShare: evaluation.evalShare,
        evalSeed: evaluation.evalSeed,
      },
    });
    if (outcome?.__typename === 'TrainJob') onCreated(outcome.id);
  });

  // The server names its field: "name", "gpuMiB", "dataSha256", "params.rank"…; that field shows the message.
  const refused = refusedField(refusal);
  const placedFields = [
    'name',
    'model',
    'baseRepo',
    'baseRevision',
    'node',
    'gpuMiB',
    'owner',
    'public',
    'data',
    'dataSha256',
    'evalShare',
    'evalSeed',
    'params',
    ...params.map((p) => `params.${p.name}`),
  ];
  const placed = refused !== undefined && placedFields.includes(refused);
  const errorAt = (field: string) =>
    local[field] ??
    (refused === field || (field === 'data' && refused === 'dataSha256') ? refusal?.message : undefined);

  return (
    <form className="train-form" aria-label="New training job" onSubmit={submit} noValidate>
      <fieldset className="panel form-section">
        <legend>The adapter</legend>
        <div className="form-row">
          <Field
            label="Name"
            value={name}
            onChange={(e) => setName(e.target.value)}
            error={errorAt('name')}
            placeholder="support-tone"
            spellCheck={false}
            hint="What requests ask for: letters, digits, '.', '_' and '-'."
            required
          />
          <SelectField
            label="Model"
            value={model}
            onChange={setModel}
            error={errorAt('model')}
            hint={
              models.length === 0 ? (
                <>
                  The catalog holds no model: serve one first (<PageLink to="/models">Models</PageLink>).
                </>
              ) : chosenModel ? (
                `Served by ${engineWords[chosenModel.engine] ?? chosenModel.engine}.`
              ) : (
                'The catalog model the adapter is for.'
              )
            }
          >
            <option value="">Choose a model</option>
            {models.map((m) => (
              <option key={m.id} value={m.name}>
                {m.name}
              </option>
            ))}
          </SelectField>
        </div>
        <div className="form-row">
          <Field
            label="Base weights"
            className="wide"
            value={baseRepo}
            onChange={(e) => setBaseRepo(e.target.value)}
            error={errorAt('baseRepo')}
            placeholder="Qwen/Qwen2.5-0.5B-Instruct"
            spellCheck={false}
            hint="The model's safetensors repository on the registry, owner/name (not a GGUF one)."
            required
          />
          <Field
            label="Revision"
            value={baseRevision}
            onChange={(e) => setBaseRevision(e.target.value)}
            error={errorAt('baseRevision')}
            placeholder="main"
            spellCheck={false}
            hint="A branch, a tag or a commit; empty: main."
          />
        </div>
        <CheckField label="Make the llama.cpp GGUF adapter" checked={ggufOn} onChange={setGguf} />
        <p className="hint">llama.cpp loads adapters only as GGUF; vLLM loads the PEFT files every job makes.</p>
      </fieldset>

      <fieldset className="panel form-section">
        <legend>Where it trains</legend>
        <div className="form-row">
          <SelectField
            label="Node"
            value={node}
            onChange={setNode}
            error={errorAt('node')}
            hint={
              nodes.length === 0 ? (
                <>
                  No node reports to Hangar: add one on the <PageLink to="/nodes">Nodes</PageLink> page.
                </>
              ) : chosenNode ? (
                gpusText(chosenNode)
              ) : (
                'The node whose agent trains it.'
              )
            }
          >
            <option value="">Choose a node</option>
            {nodes.map((n) => (
              <option key={n.id} value={n.name}>
                {n.name} — {gpusText(n)}
              </option>
            ))}
          </SelectField>
          <Field
            label="GPU memory (MiB)"
            type="number"
            min={1}
            step={1}
            value={gpuMiB}
            onChange={(e) => setGpuMiB(e.target.value)}
            error={errorAt('gpuMiB')}
            placeholder="8192"
            hint="What the job needs on one card: it waits until a GPU of the node has this much free."
            required
          />
        </div>
      </fieldset>

      <fieldset className="panel form-section">
        <legend>Who may use it</legend>
        <div className="form-row">
          <Field
            label="Owner"
            className="wide owner"
            value={isPublic ? '' : owner}
            onChange={(e) => setOwner(e.target.value)}
            error={errorAt('owner')}
            disabled={isPublic}
            placeholder={isPublic ? 'public: every caller of the model' : 'team:acme/research'}
            spellCheck={false}
            list={choices.length ? ids.owners : undefined}
            hint={
              <>
                <code>org:acme</code>, <code>team:acme/research</code>, <code>project:acme/research/bots</code>,{' '}
                <code>user:&lt;email&gt;</code> or <code>key:&lt;token id&gt;</code>. Pairs from a knowledge base need
                an owner who may read it.
              </>
            }
          />
          {choices.length ? (
            <datalist id={ids.owners}>
              {choices.map((c) => (
                <option key={c} value={c} />
              ))}
            </datalist>
          ) : null}
        </div>
        <CheckField
          label="Public: every caller of the model may use it, instead of an owner"
          checked={isPublic}
          onChange={setPublic}
          error={errorAt('public')}
        />
      </fieldset>

      <fieldset className="panel form-section">
        <legend>The pairs</legend>
        <Field
          label="Pairs file"
          className="pairs-field"
          type="file"
          accept=".jsonl,.ndjson,application/x-ndjson,application/jsonl"
          error={errorAt('data')}
          onChange={(e) => chooseFile(e.target.files?.[0])}
          hint={
            <>
              NDJSON (.jsonl or .ndjson), one <code>{'{"q": "…", "a": "…"}'}</code> per line, up to 64 MiB; a pair may
              name the knowledge-base <code>"collection"</code> it comes from. It is checked as soon as it is chosen.
            </>
          }
        />
        {dataFile.state === 'checking' ? <p className="muted">Checking {dataFile.file}…</p> : null}
        {dataFile.state === 'checked' ? <DataReport file={dataFile.file} report={dataFile.report} /> : null}
        <EvalFields
          share={evalShare}
          seed={evalSeed}
          onShare={setEvalShare}
          onSeed={setEvalSeed}
          errorAt={errorAt}
          pairs={dataFile.state === 'checked' ? dataFile.report.pairs : null}
        />
      </fieldset>

      <fieldset className="panel form-section" aria-describedby={`${ids.params}-hint`}>
        <legend>Trainer settings</legend>
        <p id={`${ids.params}-hint`} className="hint">
          The defaults suit a first run; each is checked against what the trainer accepts.
        </p>
        <div className="param-grid">
          {params.map((p) => (
            <Field
              key={p.name}
              label={p.name}
              className="param"
              type="number"
              min={p.min}
              max={p.max}
              step={paramStep(p)}
              value={values[p.name] ?? ''}
              onChange={(e) => setValues((v) => ({ ...v, [p.name]: e.target.value }))}
              error={errorAt(`params.${p.name}`)}
              hint={`${p.about}: ${paramRange(p)}`}
            />
          ))}
        </div>
        {errorAt('params') ? (
          <p role="alert" className="form-error">
            {errorAt('params')}
          </p>
        ) : null}
      </fieldset>

      <div className="form-row submit-row">
        <SubmitButton busy={fetching || dataFile.state === 'checking'}>Queue the job</SubmitButton>
        <PageLink to="/training" className="button">
          Back to the jobs
        </PageLink>
      </div>
      <FormError refusal={placed ? null : refusal} error={error} />
    </form>
  );
}
