import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { NewTrainJob_CreateMutation, NewTrainJob_OptionsQuery, NewTrainJobPage } from './new-train-job';
import type { TrainDataReport } from './train-data';

const sha = 'c0ffee'.padEnd(64, '1');

const options = {
  models: [
    { __typename: 'Model', id: 'm1', name: 'tiny-llama', engine: 'llamacpp' },
    { __typename: 'Model', id: 'm2', name: 'qwen-vllm', engine: 'vllm' },
  ],
  nodes: [
    {
      __typename: 'Node',
      id: 'n1',
      name: 'gpu-1',
      online: true,
      gpus: [{ __typename: 'Gpu', index: 0, name: 'RTX 4090', freeMiB: 20_000, totalMiB: 24_564 }],
    },
    { __typename: 'Node', id: 'n2', name: 'gpu-2', online: false, gpus: [] },
  ],
  trainParams: [
    { __typename: 'TrainParam', name: 'rank', about: 'the LoRA rank r', min: 1, max: 256, default: 16, whole: true },
    {
      __typename: 'TrainParam',
      name: 'lr',
      about: 'the peak learning rate',
      min: 1e-7,
      max: 1e-2,
      default: 2e-4,
      whole: false,
    },
  ],
};

const report = (over: Partial<TrainDataReport> = {}): TrainDataReport => ({
  pairs: 3,
  bytes: 96,
  sha256: sha,
  ok: true,
  errors: [],
  errorCount: 0,
  duplicates: [],
  duplicateCount: 0,
  collections: [],
  question: { min: 2, max: 9, mean: 5, p50: 5, p95: 9 },
  answer: { min: 5, max: 20, mean: 12.3, p50: 12, p95: 20 },
  ...over,
});

/** createTrainJob's answer: the new job's id, which its page is opened with. */
const created = () => ({ __typename: 'TrainJob', id: 'job-1' });

function renderForm(createAnswer: (input: Record<string, unknown>) => Record<string, unknown>) {
  const fake = fakeClient([
    answer(NewTrainJob_OptionsQuery, () => options),
    answer(NewTrainJob_CreateMutation, (v) => ({ createTrainJob: createAnswer(v.input) })),
  ]);
  const onCreated = vi.fn();
  render(
    <Provider value={fake.client}>
      <NewTrainJobPage onCreated={onCreated} />
    </Provider>,
  );
  return { fake, onCreated };
}

afterEach(() => vi.unstubAllGlobals());

const pairs = (text: string) => new File([text], 'pairs.jsonl', { type: '' });

describe('NewTrainJobPage', () => {
  it('checks the pairs when chosen, shows the report, and submits them by their sha256', async () => {
    const fetch = vi.fn(async () => Response.json(report({ duplicateCount: 1, duplicates: [{ line: 3, sameAs: 1 }] })));
    vi.stubGlobal('fetch', fetch);
    const { fake, onCreated } = renderForm(created);
    const user = userEvent.setup();

    await user.type(await screen.findByLabelText('Name'), 'support-tone');
    await user.selectOptions(screen.getByLabelText('Model'), 'tiny-llama');
    // llama.cpp serves it: the GGUF adapter is made unless the operator says otherwise.
    expect(screen.getByLabelText('Make the llama.cpp GGUF adapter')).toBeChecked();
    await user.type(screen.getByLabelText('Base weights'), 'hangar-test/tiny-llama');
    await user.selectOptions(screen.getByLabelText('Node'), 'gpu-1');
    expect(screen.getByText('GPU 0: 20,000 MiB free of 24,564')).toBeInTheDocument();
    await user.type(screen.getByLabelText('GPU memory (MiB)'), '4096');
    await user.click(screen.getByLabelText(/^Public/));
    expect(screen.getByLabelText('Owner')).toBeDisabled();
    await user.upload(screen.getByLabelText('Pairs file'), pairs('{"q":"a","a":"b"}\n'));

    const shown = await screen.findByRole('region', { name: 'Report on pairs.jsonl' });
    expect(shown).toHaveTextContent('3 pairs · 96 B · sha256 c0ffee111111…');
    expect(shown).toHaveTextContent('line 3 repeats line 1');
    expect(within(shown).getByText(/^Ready to train on/)).toBeInTheDocument();
    expect(new Headers((fetch.mock.calls[0] as unknown as [string, RequestInit])[1].headers).has('content-type')).toBe(
      true,
    );

    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    await vi.waitFor(() => expect(onCreated).toHaveBeenCalledWith('job-1'));
    expect(fake.sent(NewTrainJob_CreateMutation).map((op) => op.variables.input)).toEqual([
      {
        name: 'support-tone',
        model: 'tiny-llama',
        baseRepo: 'hangar-test/tiny-llama',
        baseRevision: null,
        node: 'gpu-1',
        gpuMiB: 4096,
        owner: null,
        public: true,
        dataSha256: sha,
        params: { rank: 16, lr: 0.0002 },
        gguf: true,
        evalShare: 0.1,
        evalSeed: null,
      },
    ]);
  });

  it('holds out the share of the pairs given in percent, by the seed given, and refuses a share over half here', async () => {
    vi.stubGlobal(
      'fetch',
      vi.fn(async () => Response.json(report({ pairs: 200 }))),
    );
    const { fake, onCreated } = renderForm((input) =>
      input.evalSeed === 99
        ? { __typename: 'ValidationError', code: 'VALIDATION', field: 'evalSeed', message: 'at most 2147483647' }
        : created(),
    );
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText('Name'), 'x');
    await user.type(screen.getByLabelText('GPU memory (MiB)'), '1024');
    await user.upload(screen.getByLabelText('Pairs file'), pairs('{"q":"a","a":"b"}\n'));
    await screen.findByText(/^Ready to train on/);
    const share = screen.getByLabelText('Held out for evaluation (%)');
    expect(share).toHaveValue(10);
    expect(screen.getByText(/^About 20 of the 200 pairs are never trained on/)).toBeInTheDocument();

    await user.clear(share);
    await user.type(share, '60');
    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    expect(
      await screen.findByText(/^the share of the pairs held out for evaluation, 0 to 50 %: "60" is not/),
    ).toHaveClass('field-error');
    expect(share).toHaveAttribute('aria-invalid', 'true');
    expect(fake.sent(NewTrainJob_CreateMutation)).toHaveLength(0);

    // The server's refusal of the seed is shown at the seed.
    await user.clear(share);
    await user.type(share, '25');
    await user.type(screen.getByLabelText('Evaluation seed'), '99');
    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    expect(await screen.findByText('at most 2147483647')).toHaveClass('field-error');
    expect(screen.getByLabelText('Evaluation seed')).toHaveAttribute('aria-invalid', 'true');

    await user.clear(screen.getByLabelText('Evaluation seed'));
    await user.type(screen.getByLabelText('Evaluation seed'), '7');
    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    await vi.waitFor(() => expect(onCreated).toHaveBeenCalledWith('job-1'));
    expect(
      fake.sent(NewTrainJob_CreateMutation).map((op) => [op.variables.input.evalShare, op.variables.input.evalSeed]),
    ).toEqual([
      [0.25, 99],
      [0.25, 7],
    ]);
  });

  it("asks for token counts with the chosen model's tokenizer, and shows the pairs past max_len", async () => {
    const stats = { min: 5, max: 1500, mean: 40, p50: 20, p95: 300 };
    const fetch = vi.fn(async () =>
      Response.json(
        report({
          tokens: { model: 'tiny-llama', question: stats, answer: stats, pair: stats, maxLen: 1024, overMaxLen: 2 },
        }),
      ),
    );
    vi.stubGlobal('fetch', fetch);
    renderForm(created);
    const user = userEvent.setup();
    await user.selectOptions(await screen.findByLabelText('Model'), 'tiny-llama');
    await user.upload(screen.getByLabelText('Pairs file'), pairs('{"q":"a","a":"b"}\n'));
    const shown = await screen.findByRole('region', { name: 'Report on pairs.jsonl' });
    expect((fetch.mock.calls[0] as unknown as [string])[0]).toBe('/api/train/data?model=tiny-llama');
    expect(shown).toHaveTextContent("(tiny-llama's tokenizer)");
    expect(shown).toHaveTextContent('2 of 3 pairs are longer than 1024 tokens');
  });

  it('refuses bad settings and missing pairs here, naming each at its field, and sends nothing', async () => {
    const { fake } = renderForm(created);
    const user = userEvent.setup();
    const rank = await screen.findByLabelText('rank');
    await user.clear(rank);
    await user.type(rank, '300');
    await user.click(screen.getByRole('button', { name: 'Queue the job' }));

    expect(await screen.findByText('rank (the LoRA rank r) is a whole number from 1 to 256: 300 is not')).toHaveClass(
      'field-error',
    );
    expect(rank).toHaveAttribute('aria-invalid', 'true');
    expect(screen.getByText(/^choose the pairs: a \.jsonl file/)).toBeInTheDocument();
    expect(screen.getByText(/^the GPU memory the job needs on one card/)).toBeInTheDocument();
    expect(fake.sent(NewTrainJob_CreateMutation)).toHaveLength(0);
  });

  it('shows the server’s refusal at the field it names, and one for the pairs at the file', async () => {
    vi.stubGlobal(
      'fetch',
      vi.fn(async () => Response.json(report())),
    );
    let refusal = { field: 'baseRepo', message: 'base_repo acme/nothing: no such repository on the registry' };
    const { onCreated } = renderForm(() => ({ __typename: 'ValidationError', code: 'VALIDATION', ...refusal }));
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText('Name'), 'x');
    await user.type(screen.getByLabelText('GPU memory (MiB)'), '1024');
    await user.upload(screen.getByLabelText('Pairs file'), pairs('{"q":"a","a":"b"}\n'));
    await screen.findByText(/^Ready to train on/);

    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    const atRepo = await screen.findByText('base_repo acme/nothing: no such repository on the registry');
    expect(atRepo).toHaveClass('field-error');
    expect(screen.getByLabelText('Base weights')).toHaveAttribute('aria-invalid', 'true');

    refusal = { field: 'dataSha256', message: 'line 2: needs "q" and "a", both strings' };
    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    expect(await screen.findByText('line 2: needs "q" and "a", both strings')).toHaveClass('field-error');
    expect(screen.getByLabelText('Pairs file')).toHaveAttribute('aria-invalid', 'true');

    refusal = {
      field: 'params.lr',
      message: 'params.lr (the peak learning rate) is a number from 1e-7 to 0.01: 2 is not',
    };
    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    await screen.findByText(/params\.lr \(the peak learning rate\)/);
    expect(screen.getByLabelText('lr')).toHaveAttribute('aria-invalid', 'true');
    expect(onCreated).not.toHaveBeenCalled();
  });

  it('shows a report with bad lines by number, and will not submit those pairs', async () => {
    vi.stubGlobal(
      'fetch',
      vi.fn(async () =>
        Response.json(
          report({
            ok: false,
            pairs: 1,
            errorCount: 25,
            errors: [{ line: 2, message: 'not JSON (Unexpected token); each line is {"q": "…", "a": "…"}' }],
          }),
        ),
      ),
    );
    const { fake } = renderForm(created);
    const user = userEvent.setup();
    await user.upload(await screen.findByLabelText('Pairs file'), pairs('{"q":"a","a":"b"}\nnope\n'));
    const shown = await screen.findByRole('region', { name: 'Report on pairs.jsonl' });
    expect(shown).toHaveTextContent('line 2: not JSON');
    expect(shown).toHaveTextContent('and 24 more');
    expect(shown).toHaveTextContent('25 lines are not a pair: fix them and choose the file again.');
    await user.click(screen.getByRole('button', { name: 'Queue the job' }));
    expect(await screen.findByText(/^these pairs cannot be trained on/)).toBeInTheDocument();
    expect(fake.sent(NewTrainJob_CreateMutation)).toHaveLength(0);
  });
});
