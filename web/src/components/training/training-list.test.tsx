import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it, vi } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { TrainingList, TrainingList_ChangedSubscription, TrainingList_JobsQuery } from './training-list';

const minutesAgo = (m: number) => new Date(Date.now() - m * 60_000).toISOString();

/** A job as the server sends it in the list and in each live event. */
function job(name: string, over: Record<string, unknown> = {}) {
  return {
    __typename: 'TrainJob',
    id: `id-${name}`,
    name,
    model: 'tiny-llama',
    node: { __typename: 'Node', id: 'n1', name: 'gpu-1' },
    owner: 'TEAM:t1',
    ownerLabel: 'team:acme/research',
    state: 'RUNNING',
    step: 30,
    steps: 120,
    progress: 0.25,
    loss: 2.3456,
    peakMiB: 3200,
    message: 'training',
    cancelRequested: false,
    createdAt: minutesAgo(5),
    createdBy: 'ana@example.com',
    ...over,
  };
}

const page = (jobs: unknown[]) => ({
  trainJobs: {
    __typename: 'TrainJobConnection',
    edges: jobs.map((j) => ({ __typename: 'TrainJobEdge', cursor: (j as { id: string }).id, node: j })),
    pageInfo: { __typename: 'PageInfo', hasNextPage: false, endCursor: null },
  },
});

describe('TrainingList', () => {
  it('shows each job with its progress, and follows it live without a reload', async () => {
    const fake = fakeClient([
      answer(TrainingList_JobsQuery, () =>
        page([
          job('support-tone'),
          job('old-one', {
            state: 'QUEUED',
            step: 0,
            steps: 0,
            progress: 0,
            loss: null,
            peakMiB: null,
            owner: null,
            ownerLabel: null,
            message: 'waiting for node gpu-1: it is offline',
            createdAt: minutesAgo(50),
          }),
        ]),
      ),
    ]);
    render(
      <Provider value={fake.client}>
        <TrainingList onStateChange={() => {}} canChange />
      </Provider>,
    );
    const row = await screen.findByTestId('train-job-support-tone');
    expect(within(row).getByRole('link', { name: 'support-tone' })).toHaveAttribute(
      'href',
      '/training/id-support-tone',
    );
    expect(row).toHaveTextContent('team:acme/research');
    expect(within(row).getByRole('progressbar')).toHaveAttribute('aria-valuenow', '25');
    expect(row).toHaveTextContent('step 30 of 120 (25.0 %)');
    expect(row).toHaveTextContent('loss 2.346 · peak 3.1 GiB');
    expect(screen.getByTestId('train-job-old-one')).toHaveTextContent('public');
    expect(screen.getByTestId('train-job-old-one')).toHaveTextContent('waiting for node gpu-1: it is offline');
    expect(screen.getByRole('link', { name: 'New job' })).toHaveAttribute('href', '/training/new');

    fake.push(TrainingList_ChangedSubscription, { trainJobChanged: job('support-tone', { step: 90, progress: 0.75 }) });
    expect(await within(row).findByText(/step 90 of 120/)).toBeInTheDocument();

    // A job created elsewhere joins the top of the list.
    fake.push(TrainingList_ChangedSubscription, {
      trainJobChanged: job('brand-new', { state: 'QUEUED', step: 0, steps: 0, progress: 0, createdAt: minutesAgo(0) }),
    });
    await screen.findByTestId('train-job-brand-new');
    expect(screen.getAllByRole('row').map((r) => r.getAttribute('data-testid'))).toEqual([
      null,
      'train-job-brand-new',
      'train-job-support-tone',
      'train-job-old-one',
    ]);
  });

  it('filters by state, and a job leaves the filtered list when it leaves that state', async () => {
    const fake = fakeClient([
      answer(TrainingList_JobsQuery, (v) => page(v.state === 'RUNNING' ? [job('support-tone')] : [])),
    ]);
    const onStateChange = vi.fn();
    render(
      <Provider value={fake.client}>
        <TrainingList state="RUNNING" onStateChange={onStateChange} canChange={false} />
      </Provider>,
    );
    await screen.findByTestId('train-job-support-tone');
    for (const op of fake.sent(TrainingList_JobsQuery))
      expect(op.variables).toEqual({ state: 'RUNNING', first: 50, after: null });
    expect(screen.queryByRole('link', { name: 'New job' })).toBeNull();

    fake.push(TrainingList_ChangedSubscription, {
      trainJobChanged: job('support-tone', { state: 'DONE', progress: 1 }),
    });
    expect(await screen.findByText('No running jobs.')).toBeInTheDocument();

    const user = userEvent.setup();
    await user.selectOptions(screen.getByLabelText('State'), '');
    expect(onStateChange).toHaveBeenLastCalledWith(undefined);
  });

  it('says what training is and how to start when there is no job', async () => {
    render(
      <Provider value={fakeClient([answer(TrainingList_JobsQuery, () => page([]))]).client}>
        <TrainingList onStateChange={() => {}} canChange />
      </Provider>,
    );
    expect(await screen.findByText('No training jobs yet.')).toBeInTheDocument();
    expect(screen.getByText(/teaches a catalog model a LoRA adapter/)).toBeInTheDocument();
    expect(screen.getAllByRole('link', { name: 'New job' })).toHaveLength(2);
  });
});
