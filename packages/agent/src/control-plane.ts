import { randomBytes } from 'node:crypto';
import { graphql } from '@hangar/common/client/graphql';
import { type GraphqlAnswer, GraphqlHttp, GraphqlUnanswered } from '@hangar/common/client/http';
import type { Logger } from '@hangar/common/log';
import type { TadaDocumentNode } from 'gql.tada';
import { print } from 'graphql';
import { z } from 'zod';
import type { AgentGpu } from './config.js';
import type { EngineReport } from './inventory.js';
import { NodeChannel } from './node-channel.js';

// How the agent talks to the control plane: GraphQL over HTTP POST to /graphql with the node token, and the
// node's assignments pushed over the agent's one WebSocket (node-channel.ts). Behind a small interface, so the
// runner can be tested with an in-memory stand-in and no server.

export type NodeReport = {
  gpus: AgentGpu[];
  engines: EngineReport[];
  diskFreeBytes: number | null;
  agentVersion: string;
};

export type Assignment = {
  replicaId: string;
  model: string;
  /** "llamacpp" or "vllm"; anything else fails on this node with a reason. */
  engine: string;
  /** A mirror URL of the GGUF file (ETag = its sha256), or what the engine loads for vLLM. */
  source: string;
  contextSize: number | null;
  desired: 'RUN' | 'STOP';
  /** LoRA adapters (llama.cpp: GGUF files in the mirror), each loaded into a context of its own. */
  adapters: { name: string; source: string }[];
  /** Requests the replica answers at once (sequences of one context); more wait in its queue. */
  parallel: number;
  /** The GPU (by the index this agent reported) the replica is placed on; null: split (gpuIndexes) or the node. */
  gpuIndex?: number | null;
  /**
   * The GPUs a model too large for one card is split across, an equal share on each: the engine is given these
   * cards alone and told to split the model over them. Empty (or absent): gpuIndex, or the node as a whole.
   */
  gpuIndexes?: number[];
  /** The share of each of its cards placement booked for it (vLLM's --gpu-memory-utilization); null: no budget. */
  gpuMemoryFraction?: number | null;
};

export type ReplicaState = 'LOADING' | 'READY' | 'FAILED' | 'STOPPED';

export type ReplicaReport = {
  replicaId: string;
  state: ReplicaState;
  message?: string | null;
  smokeText?: string | null;
  tokensPerSecond?: number | null;
  /**
   * With READY: the replica's OpenAI base URL (advertiseUrl(), e.g. http://10.0.0.5:8080/v1) and the engine key
   * its endpoint accepts (newEngineKey()). The control plane then smoke-tests it through that endpoint and marks
   * it READY itself; READY without both is recorded as FAILED. The key is sent in the READY report only.
   */
  endpoint?: string | null;
  engineKey?: string | null;
  /** What the replica holds after loading, when the engine can say: layers on the GPU (of all) and bytes. */
  gpuLayers?: number | null;
  totalLayers?: number | null;
  vramUsedBytes?: number | null;
  /**
   * The adapters the replica answers for now, by catalog name: the gateway sends an adapter's requests only to
   * replicas that list it. Absent leaves what the control plane has as it is (an agent from before adapters
   * were reported).
   */
  adapters?: string[] | null;
};

/** What the runner is told of the pushed assignments (ControlPlane.pushed). */
export type PushedAssignments = {
  /** The whole list: when the subscription starts, on every reconnect, and after each change. */
  onList: (list: Assignment[]) => void;
  /** The channel dropped: nothing is pushed until a list comes again, so the runner polls meanwhile. */
  onLost: () => void;
};

export interface ControlPlane {
  reportNode(report: NodeReport): Promise<void>;
  assignments(): Promise<Assignment[]>;
  /**
   * Pushes the node's assignments as they change; returns the unsubscribe. Without it (a stand-in, an agent
   * given no channel) the runner polls.
   */
  pushed?(to: PushedAssignments): () => void;
  reportReplica(report: ReplicaReport): Promise<void>;
  /** Says this agent is stopping, so the node shows offline and its replicas are placed elsewhere now. */
  leave?(): Promise<void>;
}

/**
 * `unreachable`: the request did not get an answer (network, a restart, a 5xx); worth trying again.
 * `refused`: the control plane answered no (a typed error, a bad token, an operation it does not have); the same
 * request will get the same answer.
 */
export class ControlPlaneError extends Error {
  override name = 'ControlPlaneError';
  constructor(
    message: string,
    readonly kind: 'unreachable' | 'refused',
    /** The typed error's __typename (ConflictError, NotFoundError…) when the refusal was one. */
    readonly errorType?: string,
  ) {
    super(message);
  }
}

const assignment = z.object({
  replicaId: z.string().min(1),
  model: z.string(),
  engine: z.string(),
  source: z.string().min(1),
  contextSize: z.number().int().nullish(),
  desired: z.enum(['RUN', 'STOP']),
  // An older control plane sends none.
  adapters: z.array(z.object({ name: z.string().min(1), source: z.string().min(1) })).default([]),
  parallel: z.number().int().min(1).max(64).default(1),
  gpuIndex: z.number().int().min(0).nullish(),
  gpuIndexes: z.array(z.number().int().min(0)).max(64).default([]),
  gpuMemoryFraction: z.number().min(0).max(1).nullish(),
});

// Typed from schema.graphql (src/client/graphql.ts): a field renamed on the server fails tsc and the documents'
// check here, not a node in the field.
const Agent_ReportNodeMutation = graphql(`
  mutation Agent_ReportNode($input: NodeReportInput!) {
    reportNode(input: $input) { __typename ... on Error { message } }
  }
`);

const Agent_AssignmentsQuery = graphql(`
  query Agent_Assignments {
    nodeAssignments { replicaId model engine source contextSize desired parallel gpuIndex gpuIndexes gpuMemoryFraction adapters { name source } }
  }
`);

const Agent_ServingWorkSubscription = graphql(`
  subscription Agent_ServingWork {
    nodeServingWork {
      assignments { replicaId model engine source contextSize desired parallel gpuIndex gpuIndexes gpuMemoryFraction adapters { name source } }
    }
  }
`);

const Agent_LeaveNodeMutation = graphql(
  `mutation Agent_LeaveNode { leaveNode { __typename ... on Error { message } } }`,
);

// The input is spelled out field by field, so this document does not depend on the input type's name. The second
// is without `adapters`, for a control plane from before replicas reported them (see reportReplica).
const Agent_ReportReplicaMutation = graphql(`
  mutation Agent_ReportReplica(
    $replicaId: ID!, $state: ReplicaState!, $message: String, $smokeText: String, $tokensPerSecond: Float,
    $endpoint: String, $engineKey: String, $gpuLayers: Int, $totalLayers: Int, $vramUsedBytes: Bytes, $adapters: [String!]
  ) {
    reportReplica(input: {
      replicaId: $replicaId, state: $state, message: $message, smokeText: $smokeText, tokensPerSecond: $tokensPerSecond,
      endpoint: $endpoint, engineKey: $engineKey, gpuLayers: $gpuLayers, totalLayers: $totalLayers,
      vramUsedBytes: $vramUsedBytes, adapters: $adapters
    }) { __typename ... on Error { message } }
  }
`);
const Agent_ReportReplicaWithoutAdaptersMutation = graphql(`
  mutation Agent_ReportReplica(
    $replicaId: ID!, $state: ReplicaState!, $message: String, $smokeText: String, $tokensPerSecond: Float,
    $endpoint: String, $engineKey: String, $gpuLayers: Int, $totalLayers: Int, $vramUsedBytes: Bytes
  ) {
    reportReplica(input: {
      replicaId: $replicaId, state: $state, message: $message, smokeText: $smokeText, tokensPerSecond: $tokensPerSecond,
      endpoint: $endpoint, engineKey: $engineKey, gpuLayers: $gpuLayers, totalLayers: $totalLayers,
      vramUsedBytes: $vramUsedBytes
    }) { __typename ... on Error { message } }
  }
`);

/**
 * A replica's engine key: 256 random bits, made by the agent when the replica starts, required as the bearer
 * token by its endpoint, and told to the control plane alone (in its READY report). `hgk_` so a leaked one is
 * recognised for what it is.
 */
export function newEngineKey(): string {
  return `hgk_${randomBytes(32).toString('base64url')}`;
}

export type GraphqlControlPlaneOptions = {
  /** Per HTTP request. */
  timeoutMs?: number;
  /** The agent's one channel, for the pushed assignments; without it `pushed` opens one of its own. */
  channel?: NodeChannel;
  log?: Logger;
};

/** The control plane over HTTP, and its pushed assignments over the node's channel. */
export class GraphqlControlPlane implements ControlPlane {
  /** Set once the control plane refused `adapters` as a field it does not have: an older server. */
  private withoutAdapters = false;
  private readonly timeoutMs: number;

  constructor(
    private readonly url: string,
    private readonly token: string,
    private readonly o: GraphqlControlPlaneOptions = {},
  ) {
    this.timeoutMs = o.timeoutMs ?? 15_000;
  }

  async reportNode(report: NodeReport) {
    const data = await this.request(Agent_ReportNodeMutation, { input: report });
    refusedIfError(data.reportNode, 'reportNode');
  }

  async assignments() {
    const data = await this.request(Agent_AssignmentsQuery, {});
    return readAssignments(data.nodeAssignments, 'nodeAssignments');
  }

  pushed(to: PushedAssignments) {
    const channel = this.o.channel ?? new NodeChannel({ url: this.url, token: this.token, log: this.o.log });
    const unlisten = channel.onConnection({ down: () => to.onLost() });
    const unsubscribe = channel.subscribe(Agent_ServingWorkSubscription, {
      what: 'serving work',
      next: (data) => {
        if (!data) return;
        try {
          to.onList(readAssignments(data.nodeServingWork?.assignments, 'nodeServingWork'));
        } catch (err) {
          // Left to the polls, which read the same list and say the same in their log.
          this.o.log?.warn((err as Error).message);
        }
      },
    });
    return () => {
      unlisten();
      unsubscribe();
      if (channel !== this.o.channel) channel.close();
    };
  }

  async leave() {
    // Short: the agent is exiting, and a control plane that does not answer finds the node offline soon anyway.
    const data = await graphqlRequest(this.url, this.token, Agent_LeaveNodeMutation, {}, 5000);
    refusedIfError(data.leaveNode, 'leaveNode');
  }

  async reportReplica(report: ReplicaReport) {
    const variables = {
      replicaId: report.replicaId,
      state: report.state,
      message: clip(report.message),
      smokeText: clip(report.smokeText),
      tokensPerSecond: report.tokensPerSecond ?? null,
      endpoint: report.endpoint ?? null,
      engineKey: report.engineKey ?? null,
      gpuLayers: report.gpuLayers ?? null,
      totalLayers: report.totalLayers ?? null,
      vramUsedBytes: report.vramUsedBytes ?? null,
    };
    const withAdapters = report.adapters != null && !this.withoutAdapters;
    let data: { reportReplica: unknown };
    try {
      data = withAdapters
        ? await this.request(Agent_ReportReplicaMutation, { ...variables, adapters: report.adapters ?? null })
        : await this.request(Agent_ReportReplicaWithoutAdaptersMutation, variables);
    } catch (err) {
      // A control plane older than this agent refuses the whole document for the one field it lacks; the state
      // matters more than the adapters, so it goes again without them (and so does every later report).
      if (!withAdapters || !isUnknownAdaptersField(err)) throw err;
      this.withoutAdapters = true;
      data = await this.request(Agent_ReportReplicaWithoutAdaptersMutation, variables);
    }
    refusedIfError(data.reportReplica, 'reportReplica');
  }

  private request<R, V>(doc: TadaDocumentNode<R, V>, variables: V) {
    return graphqlRequest(this.url, this.token, doc, variables, this.timeoutMs);
  }
}

/**
 * One GraphQL operation over HTTP POST with the node token (the client the CLI uses too,
 * @hangar/common/client/http), shared by the runner's and the trainer's clients so both tell "not there" (retry)
 * from "answered no" (final) the same way. Returns the operation's data.
 */
export async function graphqlRequest<R, V>(
  url: string,
  token: string,
  doc: TadaDocumentNode<R, V>,
  variables: V,
  timeoutMs?: number,
): Promise<R>;
export async function graphqlRequest(
  url: string,
  token: string,
  doc: TadaDocumentNode<unknown, unknown>,
  variables: unknown,
  timeoutMs = 15_000,
): Promise<unknown> {
  let answer: GraphqlAnswer;
  try {
    answer = await new GraphqlHttp({ url, token, print }).post(doc, variables, { timeoutMs });
  } catch (err) {
    if (!(err instanceof GraphqlUnanswered)) throw err;
    throw new ControlPlaneError(`${url} did not answer: ${err.detail}`, 'unreachable');
  }
  const { status, text, body } = answer;
  if (status >= 500 || (!body && status !== 401 && status !== 403))
    throw new ControlPlaneError(`${url} answered ${status}: ${text.slice(0, 200)}`, 'unreachable');
  if (body?.errors?.length) {
    // A masked unexpected error (a database blip, a bug) is the server failing, not a no: worth trying again.
    const internal = body.errors.every((e) => e.extensions?.code === 'INTERNAL');
    throw new ControlPlaneError(body.errors.map((e) => e.message).join('; '), internal ? 'unreachable' : 'refused');
  }
  if (!body?.data) throw new ControlPlaneError(`${url} answered ${status} without data`, 'refused');
  return body.data;
}

/** The assignments as this agent reads them; a shape it does not read is a refusal, naming the operation. */
function readAssignments(raw: unknown, op: string): Assignment[] {
  const parsed = z.array(assignment).safeParse(raw);
  if (!parsed.success)
    throw new ControlPlaneError(
      `${op} answered in a shape this agent does not read: ${parsed.error.issues[0]?.message}`,
      'refused',
    );
  return parsed.data.map((a) => ({ ...a, contextSize: a.contextSize ?? null, gpuIndex: a.gpuIndex ?? null }));
}

/** graphql-js's refusal of an input field the server's schema does not have, for `adapters`. */
function isUnknownAdaptersField(err: unknown) {
  return (
    err instanceof ControlPlaneError &&
    err.kind === 'refused' &&
    /Field "adapters" is not defined by type "ReplicaReportInput"/.test(err.message)
  );
}

/**
 * The control plane takes at most 2000 characters of a message or smoke text; a longer one (a model's stderr,
 * a long llama.cpp error) would be refused whole, and the state with it.
 */
export function clip(s: string | null | undefined) {
  if (s == null) return null;
  return s.length > 2000 ? `${s.slice(0, 1999)}…` : s;
}

/** Throws the typed error a result union answered with (`... on Error { message }`), as a refusal. */
export function refusedIfError(result: unknown, op: string) {
  const r = result as { __typename?: string; message?: string } | null | undefined;
  if (r && typeof r.message === 'string') throw new ControlPlaneError(`${op}: ${r.message}`, 'refused', r.__typename);
}
