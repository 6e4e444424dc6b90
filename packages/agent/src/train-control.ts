import type { Readable } from 'node:stream';
import { graphql } from '@hangar/common/client/graphql';
import type { Logger } from '@hangar/common/log';
import type { TadaDocumentNode } from 'gql.tada';
import { z } from 'zod';
import { ControlPlaneError, clip, graphqlRequest, refusedIfError } from './control-plane.js';
import { anySignal } from './io.js';
import { describe, NodeChannel } from './node-channel.js';
import { type DownloadOptions, downloadFile } from './train-download.js';
import type { EvalAnswer } from './train-evaluate.js';
import { parseTrainSpec, type TrainSpec } from './train-spec.js';

// The training side of the control plane, as the node agent sees it (docs/training.md): the node's work list
// over a graphql-ws subscription on the agent's one channel (node-channel.ts), the claim/report/finish mutations
// over HTTP, and the files (the pairs, the base weights, the adapter) over plain HTTP. Behind a small interface,
// so the worker is tested without a server.
// The claim's spec is read in train-spec.ts, files are fetched in train-download.ts.

// Where they lived before the split, so importers of this file keep working.
export { DownloadError, type DownloadOptions, downloadFile } from './train-download.js';
export { parseTrainSpec, type TrainSpec, TrainSpecError } from './train-spec.js';

export type JobState = 'QUEUED' | 'RUNNING' | 'DONE' | 'FAILED' | 'CANCELLED';

/** One entry of nodeTrainWork: a QUEUED job this node may claim, or a RUNNING one it holds the lease of. */
export type TrainAssignment = {
  id: string;
  name: string;
  state: JobState;
  gpuMiB: number;
  /** RUNNING only: stop the trainer, then finish the job CANCELLED. */
  cancelRequested: boolean;
};

export type TrainPoint = {
  step: number;
  loss: number;
  lr?: number | null;
  peakMiB?: number | null;
  tokensPerSecond?: number | null;
  evalLoss?: number | null;
};
export type TrainEvent = { level: 'info' | 'warn' | 'error'; message: string };
export type TrainProgressInput = {
  steps?: number | null;
  points?: TrainPoint[];
  events?: TrainEvent[];
  message?: string | null;
};

export type UploadResult =
  | { accepted: true; artifacts: { kind: string; size: number; sha256: string }[] }
  /** 422: the control plane refused the tar and has already failed the job with `reason`. */
  | { accepted: false; reason: string };

export interface TrainControl {
  /**
   * Subscribes to this node's work; `onWork` gets the whole list at once and after each change, `onReconnected`
   * is told when the connection is back after it was lost (the control plane is there again). Returns unsubscribe.
   */
  work(onWork: (jobs: TrainAssignment[]) => void, onReconnected?: () => void): () => void;
  /** Throws ControlPlaneError (refused with errorType 'ConflictError' when another runner has it), or TrainSpecError. */
  claim(id: string): Promise<{ spec: TrainSpec }>;
  report(id: string, input: TrainProgressInput): Promise<void>;
  finish(id: string, state: 'DONE' | 'FAILED' | 'CANCELLED', message?: string): Promise<void>;
  /** The base's and the adapter's answers to the held-out questions (train-evaluate.ts); absent: not evaluated. */
  reportEvaluation?(id: string, answers: EvalAnswer[]): Promise<void>;
  /** Fetches a file to `dest` (atomically: <dest>.part, then a rename), with the node token only on Hangar's own URLs. */
  download(url: string, dest: string, opts?: DownloadOptions): Promise<{ bytes: number; sha256: string }>;
  /** PUTs the adapter (a gzipped tar); throws ControlPlaneError for anything but 200 and 422. */
  upload(id: string, tarGz: Readable, signal?: AbortSignal): Promise<UploadResult>;
}

// ─── over the wire ───────────────────────────────────────────────────────────

// Typed from schema.graphql (@hangar/common/client/graphql), as control-plane.ts's: a field renamed on the server
// fails tsc here, not a node in the field. What comes back is still checked at run time (workList, the spec):
// the control plane may be older or newer than this agent.
const Agent_TrainWorkSubscription = graphql(`
  subscription Agent_TrainWork { nodeTrainWork { jobs { id name state gpuMiB cancelRequested } } }
`);
const Agent_ClaimTrainJobMutation = graphql(`
  mutation Agent_ClaimTrainJob($id: ID!) {
    claimTrainJob(id: $id) { __typename ... on TrainClaim { spec } ... on Error { message } }
  }
`);
const Agent_ReportTrainProgressMutation = graphql(`
  mutation Agent_ReportTrainProgress($id: ID!, $input: TrainProgressInput!) {
    reportTrainProgress(id: $id, input: $input) { __typename ... on Error { message } }
  }
`);
const Agent_ReportTrainEvaluationMutation = graphql(`
  mutation Agent_ReportTrainEvaluation($id: ID!, $input: TrainEvaluationInput!) {
    reportTrainEvaluation(id: $id, input: $input) { __typename ... on Error { message } }
  }
`);
const Agent_FinishTrainJobMutation = graphql(`
  mutation Agent_FinishTrainJob($id: ID!, $state: JobState!, $message: String) {
    finishTrainJob(id: $id, state: $state, message: $message) { __typename ... on Error { message } }
  }
`);

const JOB_STATES: readonly string[] = ['QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED'] satisfies JobState[];

// The state is read as any string and entries in a state this agent does not know are left out: a newer control
// plane with one more state must not make the whole list unreadable to an older agent.
const workList = z.object({
  jobs: z.array(
    z.object({
      id: z.string().min(1),
      name: z.string(),
      state: z.string(),
      gpuMiB: z.number().int(),
      cancelRequested: z.boolean(),
    }),
  ),
});

export type GraphqlTrainControlOptions = {
  log?: Logger;
  /** The agent's one channel to the control plane (node-channel.ts); the options below apply to one made here. */
  channel?: NodeChannel;
  /** Per HTTP request (not the upload). */
  timeoutMs?: number;
  /** After the subscription ended with an error (the server refused it), it is asked for again after this. */
  resubscribeMs?: number;
  /** The longest wait between reconnection tries; they start at a tenth of it and double. */
  reconnectMaxMs?: number;
  /** A ping this often; no pong within half of it and the socket is taken for dead and replaced. */
  keepAliveMs?: number;
  uploadTimeoutMs?: number;
};

/** The control plane over the node's channel (the work list) and HTTP (everything else), with the node token. */
export class GraphqlTrainControl implements TrainControl {
  private readonly origin: string;

  constructor(
    private readonly url: string,
    private readonly token: string,
    private readonly o: GraphqlTrainControlOptions = {},
  ) {
    this.origin = new URL(url).origin;
  }

  work(onWork: (jobs: TrainAssignment[]) => void, onReconnected?: () => void): () => void {
    const log = this.o.log;
    // The agent's one channel when it gave one (its replicas' work comes on it too); otherwise one of its own.
    const channel =
      this.o.channel ??
      new NodeChannel({
        url: this.url,
        token: this.token,
        log,
        reconnectMaxMs: this.o.reconnectMaxMs,
        keepAliveMs: this.o.keepAliveMs,
        resubscribeMs: this.o.resubscribeMs,
      });
    const unlisten = channel.onConnection({ up: (back) => back && onReconnected?.() });
    const unsubscribe = channel.subscribe(Agent_TrainWorkSubscription, {
      what: 'training work',
      next: (data) => {
        const parsed = workList.safeParse(data?.nodeTrainWork);
        if (!parsed.success) {
          if (data)
            log?.warn('nodeTrainWork answered in a shape this agent does not read', {
              error: parsed.error.issues[0]?.message,
            });
          return;
        }
        onWork(parsed.data.jobs.filter((j): j is TrainAssignment => JOB_STATES.includes(j.state)));
      },
    });
    return () => {
      unlisten();
      unsubscribe();
      if (channel !== this.o.channel) channel.close();
    };
  }

  async claim(id: string) {
    const data = await this.request(Agent_ClaimTrainJobMutation, { id });
    const r = data.claimTrainJob;
    refusedIfError(r, 'claimTrainJob');
    if (r?.__typename !== 'TrainClaim')
      throw new ControlPlaneError(`claimTrainJob answered ${r?.__typename ?? 'nothing'}, not a TrainClaim`, 'refused');
    return { spec: parseTrainSpec(r.spec, this.url) };
  }

  async report(id: string, input: TrainProgressInput) {
    const data = await this.request(Agent_ReportTrainProgressMutation, {
      id,
      input: {
        ...(input.steps != null ? { steps: input.steps } : {}),
        ...(input.points?.length ? { points: input.points } : {}),
        ...(input.events?.length
          ? { events: input.events.map((e) => ({ level: e.level, message: clip(e.message) ?? '' })) }
          : {}),
        ...(input.message ? { message: clip(input.message) } : {}),
      },
    });
    refusedIfError(data.reportTrainProgress, 'reportTrainProgress');
  }

  async finish(id: string, state: 'DONE' | 'FAILED' | 'CANCELLED', message?: string) {
    const data = await this.request(Agent_FinishTrainJobMutation, { id, state, message: clip(message) });
    refusedIfError(data.finishTrainJob, 'finishTrainJob');
  }

  async reportEvaluation(id: string, answers: EvalAnswer[]) {
    const data = await this.request(Agent_ReportTrainEvaluationMutation, { id, input: { answers } });
    refusedIfError(data.reportTrainEvaluation, 'reportTrainEvaluation');
  }

  download(url: string, dest: string, opts: DownloadOptions = {}) {
    return downloadFile(url, dest, { ...opts, auth: { origin: this.origin, token: this.token } });
  }

  async upload(id: string, tarGz: Readable, signal?: AbortSignal): Promise<UploadResult> {
    const target = `${this.url}/api/train/jobs/${encodeURIComponent(id)}/artifacts/peft`;
    // A tar that could not be made (a file vanished) is this node's fault, not the network's: kept apart so it is
    // not retried as if the control plane were away.
    let packError: Error | undefined;
    tarGz.once('error', (err) => {
      packError = err;
    });
    let res: Response;
    try {
      res = await fetch(target, {
        method: 'PUT',
        headers: { authorization: `Bearer ${this.token}`, 'content-type': 'application/gzip' },
        body: tarGz as unknown as RequestInit['body'],
        duplex: 'half',
        signal: anySignal(signal, AbortSignal.timeout(this.o.uploadTimeoutMs ?? 30 * 60_000)),
      } as RequestInit);
    } catch (err) {
      if (packError) throw new Error(`the adapter could not be packed: ${packError.message}`);
      if (signal?.aborted) throw signal.reason ?? err;
      throw new ControlPlaneError(`${target} did not take the upload: ${describe(err)}`, 'unreachable');
    } finally {
      if (!tarGz.destroyed && !tarGz.readableEnded) tarGz.destroy();
    }
    const text = await res.text().catch(() => '');
    let body: { error?: unknown; artifacts?: unknown } | undefined;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    if (res.status === 200) {
      const artifacts = z
        .array(z.object({ kind: z.string(), size: z.number(), sha256: z.string() }))
        .safeParse(body?.artifacts);
      return { accepted: true, artifacts: artifacts.success ? artifacts.data : [] };
    }
    if (res.status === 422)
      return { accepted: false, reason: typeof body?.error === 'string' ? body.error : text.slice(0, 500) };
    const why = `${target} answered ${res.status}: ${typeof body?.error === 'string' ? body.error : text.slice(0, 200)}`;
    throw new ControlPlaneError(
      why,
      res.status >= 500 || res.status === 408 || res.status === 429 ? 'unreachable' : 'refused',
    );
  }

  private request<R, V>(doc: TadaDocumentNode<R, V>, variables: V) {
    return graphqlRequest(this.url, this.token, doc, variables, this.o.timeoutMs);
  }
}
