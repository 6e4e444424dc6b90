import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it, vi } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { POINTS_PER_EVENT, TrainCharts_MetricsQuery, TrainCharts_PointsSubscription } from './train-charts';
import {
  TrainJobActions_CancelMutation,
  TrainJobActions_DeleteMutation,
  TrainJobActions_PublishMutation,
} from './train-job-actions';
import { TrainJobPage, TrainJobPage_ChangedSubscription, TrainJobPage_JobQuery } from './train-job-page';

const now = new Date().toISOString();

/** The job as its page's query and subscription send it. */
function job(over: Record<string, unknown> = {}) {
  return {
    __typename: 'TrainJob',
    id: 'j1',
    name: 'support-tone',
    model: 'tiny-llama',
    node: { __typename: 'Node', id: 'n1', name: 'gpu-1' },
    owner: null,
    ownerLabel: null,
    state: 'RUNNING',
    step: 2,
    steps: 10,
    progress: 0.2,
    loss: 2.5,
    peakMiB: 900,
    message: 'training',
    cancelRequested: false,
    createdAt: now,
    createdBy: 'ana@example.com',
    baseRepo: 'hangar-test/tiny-llama',
    baseRevision: null,
    gpuMiB: 4096,
    gguf: true,
    params: { rank: 16, lr: 0.0002 },
    pairs: 3,
    dataSha256: 'd'.repeat(64),
    dataBytes: 96,
    startedAt: now,
    finishedAt: null,
    adapter: null,
    events: [{ __typename: 'TrainEvent', id: 'e1', level: 'info', message: 'claimed by node gpu-1', at: now }],
    artifacts: [],
    heldOut: 5,
    evaluation: null,
    ...over,
  };
}

const metric = (step: number) => ({
  __typename: 'TrainMetric',
  step,
  loss: 3 - step * 0.25,
  lr: 0.0002,
  peakMiB: 800 + step * 50,
  tokensPerSecond: 1200,
  evalLoss: step % 2 === 0 ? 3.2 - step * 0.2 : null,
});

function renderPage(state: { job: ReturnType<typeof job>; metrics: number }) {
  const fake = fakeClient([
    answer(TrainJobPage_JobQuery, () => ({
      trainJob: state.job,
      trainParams: [{ __typename: 'TrainParam', name: 'rank', about: 'the LoRA rank r' }],
    })),
    answer(TrainCharts_MetricsQuery, () => ({
      trainJob: {
        __typename: 'TrainJob',
        id: 'j1',
        metrics: Array.from({ length: state.metrics }, (_, i) => metric(i + 1)),
      },
    })),
    answer(TrainJobActions_CancelMutation, () => ({
      cancelTrainJob: {
        __typename: 'TrainJob',
        id: 'j1',
        state: 'RUNNING',
        cancelRequested: true,
        jobMessage: 'cancelling: the node is stopping the trainer',
      },
    })),
    answer(TrainJobActions_PublishMutation, () => ({
      publishTrainJob: {
        __typename: 'TrainJobPublished',
        adapter: 'support-tone',
        model: 'tiny-llama',
        source: 'http://hangar.test/mirror/support-tone/job-j1/support-tone.gguf',
        owner: null,
        note: 'tiny-llama’s llama.cpp replicas load it within seconds, without a restart',
        liveWithoutRestart: true,
      },
    })),
    answer(TrainJobActions_DeleteMutation, () => ({
      deleteTrainJob: { __typename: 'DeletedTrainJob', id: 'j1', name: 'support-tone' },
    })),
  ]);
  const onDeleted = vi.fn();
  render(
    <Provider value={fake.client}>
      <TrainJobPage id="j1" canChange onDeleted={onDeleted} />
    </Provider>,
  );
  return { fake, onDeleted };
}

describe('TrainJobPage', () => {
  it('draws the curves and appends the points each live event carries, reading them again only on a gap', async () => {
    const state = { job: job(), metrics: 2 };
    const { fake } = renderPage(state);
    expect(await screen.findByRole('heading', { name: 'support-tone' })).toBeInTheDocument();
    const loss = await screen.findByRole('figure', { name: /^Loss/ });
    // The figure is there at once; its curve once the points are read ("Reading the curve…" until then).
    expect(await within(loss).findByRole('img')).toHaveAccessibleName(
      'Loss: 2 steps, from 2.750 at step 1 to 2.500 at step 2; lowest 2.500, highest 2.750',
    );
    expect(loss).toHaveTextContent('step 1');
    expect(screen.getByRole('figure', { name: /^Peak GPU memory/ })).toHaveTextContent('asked for 4.0 GiB');
    expect(screen.getByRole('progressbar')).toHaveAttribute('aria-valuenow', '20');
    const reads = fake.sent(TrainCharts_MetricsQuery).length;

    state.metrics = 6;
    fake.push(TrainJobPage_ChangedSubscription, { trainJobChanged: job({ step: 6, progress: 0.6, loss: 1.5 }) });
    // The event's newest points overlap the curve: the ones after its last step are appended, nothing is read.
    const points = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => metric(from + i));
    fake.push(TrainCharts_PointsSubscription, {
      trainJobChanged: { __typename: 'TrainJob', id: 'j1', metrics: points(1, 6) },
    });
    expect(await screen.findByText(/step 6 of 10/)).toBeInTheDocument();
    await vi.waitFor(() =>
      expect(within(loss).getByRole('img')).toHaveAccessibleName(/^Loss: 6 steps, .* to 1\.500 at step 6/),
    );
    expect(fake.sent(TrainCharts_MetricsQuery)).toHaveLength(reads);

    // A full batch that starts past the curve's end may have skipped points: the whole curve is read again.
    state.metrics = 6 + 10 + POINTS_PER_EVENT;
    fake.push(TrainCharts_PointsSubscription, {
      trainJobChanged: { __typename: 'TrainJob', id: 'j1', metrics: points(17, 16 + POINTS_PER_EVENT) },
    });
    // Longer than the default second: a busy machine can take that long to render 86 points.
    await vi.waitFor(() => expect(fake.sent(TrainCharts_MetricsQuery).length).toBeGreaterThan(reads), 3000);
    await vi.waitFor(
      () => expect(within(loss).getByRole('img')).toHaveAccessibleName(new RegExp(`^Loss: ${state.metrics} steps`)),
      3000,
    );
    expect(screen.getByRole('row', { name: /rank 16 the LoRA rank r/ })).toBeInTheDocument();
    expect(screen.getByText('claimed by node gpu-1')).toBeInTheDocument();
  });

  it('shows the held-out loss beside the training loss, and the evaluation with the questions side by side', async () => {
    const metricRow = (set: string, name: string, base: number, adapter: number, low: number, high: number) => ({
      __typename: 'EvalMetric',
      set,
      name,
      base,
      adapter,
      difference: adapter - base,
      low,
      high,
    });
    const evaluation = {
      __typename: 'TrainEvaluation',
      heldOut: 5,
      seed: 42,
      verdict: 'WORSE',
      forgettingVerdict: 'NO_CLEAR_DIFFERENCE',
      metrics: [
        metricRow('pairs', 'tokenF1', 0.6, 0.2, -0.6, -0.2),
        metricRow('general', 'tokenF1', 0.5, 0.5, -0.1, 0.1),
      ],
      questions: [
        {
          __typename: 'EvalQuestion',
          set: 'pairs',
          question: 'What is the code word for item 3?',
          reference: 'word 3',
          baseAnswer: 'word 3',
          adapterAnswer: 'banana',
          baseF1: 1,
          adapterF1: 0,
        },
      ],
    };
    renderPage({ job: job({ state: 'DONE', evaluation }), metrics: 4 });
    const loss = await screen.findByRole('figure', { name: /^Loss/ });
    expect(await within(loss).findByText(/held-out loss \(2\.400 at step 4\)/)).toBeInTheDocument();
    const panel = await screen.findByRole('region', { name: 'Evaluation' });
    expect(within(panel).getByText('worse than the base')).toBeInTheDocument();
    expect(within(panel).getByText('no clear difference')).toBeInTheDocument();
    const measures = within(panel).getByRole('table', { name: 'Measures, base against adapter' });
    expect(
      within(measures).getByRole('row', { name: /held-out pairs Token F1 0\.600 0\.200 -0\.400 -0\.600 to -0\.200/ }),
    ).toBeInTheDocument();
    const questions = within(panel).getByRole('table', { name: 'The questions, side by side' });
    expect(
      within(questions).getByRole('row', {
        name: /What is the code word for item 3\? word 3 word 3 banana 1\.00 → 0\.00/,
      }),
    ).toBeInTheDocument();
  });

  it('cancels a running job and shows it as cancelling until its node has stopped', async () => {
    const { fake } = renderPage({ job: job(), metrics: 0 });
    const user = userEvent.setup();
    await user.click(await screen.findByRole('button', { name: 'Cancel' }));
    // Asked first, saying what is lost; nothing is sent until it is confirmed.
    expect(screen.getByRole('group', { name: /^Cancel / })).toHaveTextContent(
      /the steps trained so far \(\d+ of \d+\) are lost/,
    );
    expect(fake.sent(TrainJobActions_CancelMutation)).toEqual([]);
    await user.click(screen.getByRole('button', { name: /^Cancel .+/ }));
    expect(await screen.findAllByText('cancelling…')).not.toHaveLength(0);
    expect(screen.queryByRole('button', { name: 'Cancel' })).toBeNull();
    // The aliased message is the job's own: the page shows it.
    expect(screen.getByText('cancelling: the node is stopping the trainer')).toBeInTheDocument();
    expect(screen.queryByRole('button', { name: 'Delete' })).toBeNull();
    expect(fake.sent(TrainJobActions_CancelMutation).map((op) => op.variables)).toEqual([{ id: 'j1' }]);
    expect(screen.getByText('The trainer has not reported its memory yet.')).toBeInTheDocument();
  });

  it('publishes a finished job and says what to do next, then links to the adapter', async () => {
    const state = { job: job({ state: 'DONE', step: 10, progress: 1, message: 'trained' }), metrics: 10 };
    const { fake } = renderPage(state);
    const user = userEvent.setup();
    await user.click(await screen.findByRole('button', { name: 'Publish' }));
    const answered = (await screen.findByText(/^Published as tiny-llama's adapter/)).closest('[role="status"]');
    expect(answered).toHaveTextContent(
      "Published as tiny-llama's adapter support-tone: see it under tiny-llama on the Models page.",
    );
    expect(answered).toHaveTextContent('load it within seconds, without a restart');
    expect(screen.getByText('http://hangar.test/mirror/support-tone/job-j1/support-tone.gguf')).toBeInTheDocument();
    // Live without a restart: the one action left is calling it, in the model's playground with it chosen.
    expect(
      within(answered as HTMLElement).getByRole('link', { name: 'Try support-tone in the playground' }),
    ).toHaveAttribute('href', '/models/tiny-llama?call=support-tone');
    expect(screen.queryByRole('button', { name: 'Publish' })).toBeNull();

    fake.push(TrainJobPage_ChangedSubscription, { trainJobChanged: { ...state.job, adapter: 'support-tone' } });
    expect(await screen.findByRole('link', { name: /see it under tiny-llama on the Models page/ })).toHaveAttribute(
      'href',
      '/models',
    );
  });

  it('deletes an ended job after asking, and leaves the page', async () => {
    const { onDeleted } = renderPage({
      job: job({
        state: 'FAILED',
        message: 'gpu-1 stopped reporting for 120 s',
        artifacts: [
          {
            __typename: 'TrainArtifact',
            kind: 'peft',
            filename: 'support-tone-peft.tar.gz',
            size: 2048,
            sha256: 'e'.repeat(64),
            url: '/api/train/jobs/j1/artifacts/peft',
            files: [
              { __typename: 'TrainArtifactFile', name: 'adapter_config.json', size: 400, sha256: 'f'.repeat(64) },
            ],
          },
        ],
      }),
      metrics: 0,
    });
    expect(await screen.findByText('gpu-1 stopped reporting for 120 s')).toHaveClass('form-error');
    expect(screen.getByRole('link', { name: 'Download' })).toHaveAttribute('href', '/api/train/jobs/j1/artifacts/peft');
    const user = userEvent.setup();
    await user.click(screen.getByRole('button', { name: 'Delete' }));
    const dialog = screen.getByRole('alertdialog', { name: 'Delete the job support-tone?' });
    expect(within(dialog).getByRole('button', { name: 'Keep it' })).toHaveFocus();
    await user.click(within(dialog).getByRole('button', { name: 'Delete support-tone' }));
    await vi.waitFor(() => expect(onDeleted).toHaveBeenCalled());
  });
});
