import { randomUUID } from 'node:crypto';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import {
  ApiError,
  invalid,
  modelNotFound,
  notJson,
  readBody,
  sendError,
  sendOpenAiJson,
} from '@hangar/common/openai-error';
import { sleep } from '@hangar/common/retry';
import type { AuthService } from '../auth/auth.service.js';
import type { CatalogService } from '../catalog/catalog.service.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import { isDatabaseUnreachable } from '../db/outage.js';
import type { LimitGate } from '../governance/limits-gate.js';
import type { OrgService } from '../org/org.service.js';
import type { PubSub } from '../pubsub.js';
import { affinityKey } from './affinity.js';
import { AnswerCut, readCapped, watchAnswer } from './answer-limits.js';
import { refuseEarly, relayable, relayedError, unavailable, whyNotReady } from './answers.js';
import { admits, type Caller, Callers } from './callers.js';
import { Departure } from './departure.js';
import { admitOrFallBack, fallbackTargets, withModel } from './fallbacks.js';
import type { LoadCounts } from './load-report.js';
import {
  estimatePromptTokens,
  JsonTap,
  readWhole,
  SseTap,
  send,
  UpstreamUnreached,
  type Usage,
  usageOfAnswer,
} from './proxy.js';
import { relay } from './relay.js';
import { HashRing, loadBound } from './ring.js';
import { type RouteModel, type RouteReplica, RouteTable, type Target } from './routes.js';
import { type Outcome, type UsageEvent, UsageRecorder } from './usage.js';

// The request path applications use: OpenAI's API on the control plane's own port. A name resolves to a model or
// an adapter the caller may see (anything else is the same 404 as a name nobody has), a READY replica holding it
// answers (the one with the fewest requests in flight from this server), an on-demand model is woken and the
// request waits for it, bounded. What a replica sends is passed through as it comes, with backpressure; a client
// that goes away aborts the replica's work at once. Every request is accounted (usage.ts).
//
// Kept as one class of about 470 lines: handle, forward, pick, markFailing, waitFor and wake share the in-flight,
// failing and waiting maps that choose a replica and bound the wait; cut apart, each would take those maps as
// arguments. The answers that are not a replica's are in answers.ts.

export type GatewayDeps = {
  db: Db;
  config: Config;
  log: Logger;
  auth: AuthService;
  org: OrgService;
  /** Wakes an on-demand model for a request, and keeps each model's last request (its idle clock). */
  catalog: Pick<CatalogService, 'wakeIfAsleep' | 'recordLastRequest'>;
  pubsub: PubSub;
  /** Since when this process has heard the database's events unbroken (callers are kept only while it does). */
  listeningSince: () => number | undefined;
  /** Told of every request the gateway accounts (Prometheus' counters). */
  onUsage?: (e: UsageEvent) => void;
  /** Limits and budgets (governance/limits-gate.ts): checked before a replica is picked, charged as usage is. */
  limits?: LimitGate;
};

/** A request body larger than this is refused, as a node's endpoint refuses it (agent/openai/http.ts). */
const MAX_BODY_BYTES = 4 * 1024 * 1024;
/** A replica that failed a request is skipped this long (it is tried again after, or when it is the only one). */
const FAILING_MS = 10_000;
/** A non-streamed answer up to this size is passed on whole, in one write; a larger one streams through. */
const WHOLE_MAX_BYTES = 1024 * 1024;
/** A replica's error answer is read up to this much (an OpenAI error is a few hundred bytes). */
const ERROR_MAX_BYTES = 64 * 1024;

const POST_ROUTES = new Set(['/chat/completions', '/completions', '/embeddings']);

export type ReplicaLoad = { inFlight: number; failing: string | null; failingUntil: Date | null };

export class Gateway {
  readonly routes: RouteTable;
  readonly usage: UsageRecorder;
  readonly callers: Callers;
  private readonly inFlight = new Map<string, number>();
  private readonly failing = new Map<string, { until: number; why: string }>();
  private readonly waitingFor = new Map<string, number>();
  /** The same, by model and caller: each caller's share of HANGAR_GATEWAY_WAKE_QUEUE (waitFor). */
  private readonly waitingBy = new Map<string, number>();
  /** Each model's hash ring, built once per snapshot of its replicas (routes.ts makes a new list per refresh). */
  private readonly rings = new WeakMap<readonly RouteReplica[], HashRing>();
  private turn = 0;

  constructor(private readonly deps: GatewayDeps) {
    this.routes = new RouteTable({
      db: deps.db,
      log: deps.log,
      events: { pubsub: deps.pubsub, listeningSince: deps.listeningSince },
      rereadMs: deps.config.gatewayRoutesRereadSeconds * 1000,
    });
    this.usage = new UsageRecorder({
      db: deps.db,
      log: deps.log,
      catalog: deps.catalog,
      observe: deps.onUsage,
      spoolDir: path.join(deps.config.dataDir, 'usage'),
    });
    this.callers = new Callers({
      auth: deps.auth,
      org: deps.org,
      events: { pubsub: deps.pubsub, listeningSince: deps.listeningSince, log: deps.log },
    });
  }

  async start() {
    this.callers.start();
    await this.usage.start();
    await this.routes.start();
  }

  async stop() {
    this.routes.stop();
    this.callers.stop();
    await this.usage.stop();
  }

  /** How loaded a replica is as this server sees it, for the Models page. */
  load(replicaId: string): ReplicaLoad {
    const f = this.failing.get(replicaId);
    const live = f && f.until > Date.now() ? f : undefined;
    return {
      inFlight: this.inFlight.get(replicaId) ?? 0,
      failing: live?.why ?? null,
      failingUntil: live ? new Date(live.until) : null,
    };
  }

  /** Requests this process has sent to replicas and not yet seen answered. */
  inFlightTotal(): number {
    let total = 0;
    for (const n of this.inFlight.values()) total += n;
    return total;
  }

  /** Requests in this process waiting for a model to start. */
  waiting(model: string): number {
    return this.waitingFor.get(model) ?? 0;
  }

  /** What this process holds open, for the load it publishes to the autoscaler (load-report.ts). */
  loadCounts(): LoadCounts {
    return {
      inFlight: this.inFlight,
      waiting: this.waitingFor,
      modelId: (name) => this.routes.lookup(name)?.model.id,
    };
  }

  /**
   * Answers a request under /v1; `requestId` is the HTTP edge's, so a wake it causes is audited under it, and
   * `log` the edge's logger for the request (edge.log), which writes that id on the gateway's lines of it.
   */
  async handle(
    req: IncomingMessage,
    res: ServerResponse,
    path: string,
    requestId?: string,
    log: Logger = this.deps.log,
  ): Promise<void> {
    // A replica's answer is relayed on the console's origin: no browser may read one as anything but its type.
    res.setHeader('x-content-type-options', 'nosniff');
    try {
      await this.answer(req, res, path, requestId, log);
    } catch (err) {
      // Whatever went wrong is still said in OpenAI's words, which the caller's client reads; one that needs
      // the database while it is away (a caller not seen lately, a wake) is told to come back, with when.
      const outage = isDatabaseUnreachable(err);
      // An outage is logged once by the loops that meet it (db/outage.ts), not once per request here.
      if (outage) log.debug('gateway: a request needed the database while it is away', { requestId, path });
      else log.error('gateway: a request failed', { requestId, path, error: err });
      if (res.headersSent) return void res.destroy();
      sendError(
        res,
        outage
          ? new ApiError(
              503,
              'Hangar cannot reach its database just now and needs it for this request; try again shortly.',
              'server_error',
              null,
              'service_unavailable',
              { 'retry-after': '5' },
            )
          : new ApiError(500, 'The server had an error while processing your request.', 'server_error'),
      );
    }
  }

  private async answer(
    req: IncomingMessage,
    res: ServerResponse,
    path: string,
    requestId: string | undefined,
    log: Logger,
  ): Promise<void> {
    const route = path.slice('/v1'.length);
    const isModels = route === '/models' || route.startsWith('/models/');
    if (!(req.method === 'GET' && isModels) && !(req.method === 'POST' && POST_ROUTES.has(route))) {
      return refuseEarly(
        req,
        res,
        new ApiError(404, `Invalid URL (${req.method} ${path})`, 'invalid_request_error', null, 'unknown_url'),
      );
    }
    const who = await this.callers.identify(req);
    if (!who.ok) {
      return refuseEarly(req, res, new ApiError(401, who.reason, 'invalid_request_error', null, 'invalid_api_key'));
    }
    if (isModels) this.deps.limits?.peek(res, who.caller);
    if (isModels) return this.listModels(res, who.caller, route === '/models' ? null : route.slice('/models/'.length));

    const raw = await readBody(req, {
      maxBytes: MAX_BODY_BYTES,
      // HANGAR_BODY_TIMEOUT_MS, as for every small body.
      timeoutMs: this.deps.config.bodyTimeoutMs,
      who: 'the gateway',
      refuse: (err) => refuseEarly(req, res, err),
    });
    if (!raw) return;
    let body: Record<string, unknown>;
    try {
      body = JSON.parse(raw.toString('utf8')) as Record<string, unknown>;
      if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new Error('not an object');
    } catch {
      return sendError(res, notJson());
    }
    if (typeof body.model !== 'string' || !body.model) {
      return sendError(res, invalid("Missing required parameter: 'model'.", 'model', 'missing_required_parameter'));
    }
    const asked = this.visible(who.caller, body.model);
    if (!asked) return sendError(res, modelNotFound(body.model));
    // Every limit that applies, checked before a replica is picked (governance/); a refusal sends the request to
    // the model's fallbacks the caller may call, else it is answered.
    const admitted = this.deps.limits
      ? await admitOrFallBack(this.deps.limits, res, who.caller, asked, body, raw, route, (name) =>
          this.visible(who.caller, name),
        )
      : { target: asked, body, raw, limit: undefined };
    if (!admitted) return;
    const { target, limit } = admitted;
    const caller = { ...who.caller, requestId, limit, log };
    try {
      let refused = await this.forward(res, route, admitted.body, admitted.raw, target, caller, req.headers);
      // The model could not answer before a byte was sent: its fallbacks are tried in order, each only if this caller
      // may call it (one they may not is passed over as if not listed), and the answer says which model it is.
      for (const next of refused ? fallbackTargets(target.model, (name) => this.visible(caller, name)) : []) {
        const name = next.adapter?.name ?? next.model.name;
        const nextBody = withModel(admitted.body, name);
        res.setHeader('x-hangar-fallback', name);
        refused = await this.forward(res, route, nextBody.body, nextBody.raw, next, caller, req.headers);
        if (!refused) return;
      }
      if (!refused) return;
      res.removeHeader('x-hangar-fallback');
      sendError(res, refused);
    } finally {
      // What was reserved and not delivered goes back (each forward charged what it delivered).
      limit?.settle();
    }
  }

  /** The name as this caller may call it; undefined for one they may not see, exactly as for one nobody has. */
  private visible(caller: Caller, name: string): Target | undefined {
    const target = this.routes.lookup(name);
    if (!target || !admits(caller, target.model.owner)) return undefined;
    if (target.adapter && !admits(caller, target.adapter.owner)) return undefined;
    return target;
  }

  private async listModels(res: ServerResponse, caller: Caller, one: string | null) {
    const cards: Record<string, unknown>[] = [];
    const models = this.routes.models().filter((m) => m.mode !== 'STOPPED' && admits(caller, m.owner));
    const owners = [...new Set(models.flatMap((m) => [m.owner, ...[...m.adapters.values()].map((a) => a.owner)]))]
      .filter((o): o is string => o !== null)
      .map((o) => {
        const [scope, id] = o.split(':') as [never, string];
        return { scope, id };
      });
    const labels = owners.length ? await this.deps.org.formatOwners(owners) : new Map<string, string>();
    const ownedBy = (owner: string | null) => (owner ? (labels.get(owner) ?? owner) : 'hangar');
    for (const m of models) {
      const created = Math.floor(m.createdAt.getTime() / 1000);
      // A model whose name an adapter holds (routes.ts) is not called by it: one card per name, the adapter's.
      if (!this.routes.lookup(m.name)?.adapter)
        cards.push({ id: m.name, object: 'model', created, owned_by: ownedBy(m.owner) });
      for (const a of m.adapters.values()) {
        if (!admits(caller, a.owner)) continue;
        // vLLM's shape for a LoRA adapter: the base it runs on as `parent` and `root`.
        cards.push({ id: a.name, object: 'model', created, owned_by: ownedBy(a.owner), parent: m.name, root: m.name });
      }
    }
    if (one !== null) {
      let name: string;
      try {
        name = decodeURIComponent(one);
      } catch {
        return sendError(res, invalid(`The model name in the path is not percent-encoded UTF-8: ${one}`, 'model'));
      }
      const card = cards.find((c) => c.id === name);
      return card ? sendOpenAiJson(res, 200, card) : sendError(res, modelNotFound(name));
    }
    sendOpenAiJson(res, 200, { object: 'list', data: cards });
  }

  private async forward(
    res: ServerResponse,
    route: string,
    body: Record<string, unknown>,
    raw: Buffer,
    target: Target,
    caller: Caller,
    headers: IncomingHttpHeaders,
  ): Promise<ApiError | undefined> {
    const started = performance.now();
    // On the database's clock: the model's awake-until is worked out from it, and placement judges that there.
    const at = this.deps.db.clock.now();
    const abort = new Departure();
    const gone = () => {
      if (!res.writableFinished) abort.abort(new Error('the client went away'));
    };
    res.once('close', gone);
    // The tap is piped into res by hand (below), and an 'error' nobody listens for would end the process.
    res.on('error', gone);
    const stream = body.stream === true;
    const options = body.stream_options as { include_usage?: unknown } | null | undefined;
    const clientWantsUsage = options?.include_usage === true;
    // Every engine is asked for its usage, so each streamed request is accounted; the client still gets exactly
    // what it asked for (SseTap strips the chunk it did not).
    const askUsage = stream && !clientWantsUsage && route !== '/embeddings';
    // llama-server applies an adapter by its place in the list it was started with (`lora: [{id, scale}]`), not by
    // name: a caller's own `lora` field could reach an adapter it may not see, so it is never passed on, and the
    // gateway sets it for the adapter asked for, per replica (the agent's own endpoint and vLLM go by `model`
    // and ignore the field).
    const plain = !askUsage && !('lora' in body) && !target.adapter;
    const bodyFor = (r: RouteReplica): Buffer => {
      if (plain) return raw;
      const { lora: _dropped, ...rest } = body;
      const out: Record<string, unknown> = rest;
      if (askUsage) out.stream_options = { ...(options ?? {}), include_usage: true };
      if (target.adapter) out.lora = [{ id: [...r.adapters].indexOf(target.adapter.name), scale: 1 }];
      try {
        return Buffer.from(JSON.stringify(out));
      } catch (err) {
        // Nested deeper than the stack goes: JSON.parse took it, writing it out again cannot.
        if (!(err instanceof RangeError)) throw err;
        throw invalid('The request body nests arrays or objects too deeply; send a flatter body.', null, null);
      }
    };
    this.usage.touch(target.model.name);
    // Which replica holds this conversation's prompt, by the model's policy (affinity.ts); undefined: least loaded.
    const key = affinityKey({
      policy: target.model.routing,
      route,
      body,
      headers,
      scope: caller.userId,
      adapter: target.adapter?.name ?? '',
    });

    let replica: RouteReplica | undefined;
    let outcome: Outcome = 'error';
    let usage: Usage | null = null;
    let firstAt: number | null = null;
    /** Why the last replica tried refused the gateway itself (401/403): the model's state, said as a 503. */
    let refusedBy: string | undefined;
    try {
      const tried = new Set<string>();
      for (let attempt = 0; attempt < 2; attempt++) {
        const picked =
          this.pick(target, tried, key) ?? (attempt === 0 ? await this.waitFor(target, caller, abort, key) : undefined);
        if (abort.aborted) {
          outcome = 'aborted';
          return;
        }
        if (!picked) {
          if (!tried.size) return; // waitFor answered (503 with the fleet's reason) or the request was refused
          break;
        }
        // No replica and none in time: a fallback may answer (the caller's answer() says it, or sends this).
        if (picked instanceof ApiError) return picked;
        replica = picked;
        tried.add(replica.id);
        this.inFlight.set(replica.id, (this.inFlight.get(replica.id) ?? 0) + 1);
        let unwatch: (() => void) | undefined;
        try {
          const upstream = await send({
            endpoint: replica.endpoint as string,
            route,
            engineKey: replica.engineKey as string,
            body: bodyFor(replica),
            stream,
            firstByteMs: this.deps.config.gatewayFirstByteMs,
            gone: abort,
          });
          // An answer already whole (a small one comes in the read that brought its headers) cannot hang or run
          // on: no timers for it.
          unwatch = upstream.complete
            ? undefined
            : watchAnswer(upstream, {
                idleMs: this.deps.config.gatewayIdleMs,
                deadlineMs: this.deps.config.gatewayDeadlineSeconds * 1000,
              });
          const status = upstream.statusCode ?? 502;
          if (status >= 500 && attempt === 0) {
            // Nothing reached the client yet: the replica is set aside and another one gets the request.
            upstream.resume();
            this.markFailing(replica, `answered ${status}`, caller.log);
            continue;
          }
          if (status === 401 || status === 403) {
            // The node no longer takes the replica's key: it is being stopped (or restarted with another key).
            // That refusal is of the gateway, not of the caller, whose client would tell them their key is wrong.
            upstream.resume();
            refusedBy = `its replica on ${replica.nodeName ?? 'a node'} refused the gateway's key (${status}), as a replica being stopped or restarted does`;
            this.markFailing(replica, `refused the gateway's engine key (${status})`, caller.log);
            await this.routes.refresh();
            continue;
          }
          if (status >= 400 || !relayable(upstream.headers['content-type'])) {
            // Read whole and looked into: it may quote the engine key, or be a page no browser should render.
            // A body cut off midway is not OpenAI's JSON either: answered in the gateway's words below.
            const whole = await readCapped(upstream, ERROR_MAX_BYTES).catch(() => Buffer.alloc(0));
            if (status < 400) {
              this.markFailing(replica, `answered ${String(upstream.headers['content-type'])}, not JSON`, caller.log);
              if (attempt === 0) continue;
              return void sendError(
                res,
                new ApiError(
                  502,
                  `The replica serving ${target.model.name} answered with a page, not JSON.`,
                  'server_error',
                ),
              );
            }
            const retryAfter = upstream.headers['retry-after'];
            res.setHeader('x-hangar-replica', replica.id);
            return void sendError(
              res,
              relayedError(status, whole, {
                engineKey: replica.engineKey as string,
                model: target.model.name,
                retryAfter,
              }),
            );
          }
          const headers: Record<string, string> = {
            'content-type': String(upstream.headers['content-type'] ?? 'application/json'),
            // Which replica answered (its id, as usage and the Models page name it): for scripts that follow
            // where conversations went.
            'x-hangar-replica': replica.id,
          };
          for (const h of ['retry-after', 'x-request-id', 'cache-control']) {
            const v = upstream.headers[h];
            if (typeof v === 'string') headers[h] = v;
          }
          const sse = String(upstream.headers['content-type'] ?? '').startsWith('text/event-stream');
          const length = Number(upstream.headers['content-length']);
          if (!sse && Number.isFinite(length) && length <= WHOLE_MAX_BYTES) {
            // A whole JSON answer (most non-streamed ones) is read, then sent in one write with its length: no
            // stream machinery per request, and the client gets a Content-Length rather than chunks.
            const headersAt = performance.now();
            let whole: Buffer;
            try {
              whole = await readWhole(upstream, length);
            } catch (err) {
              if (abort.aborted) {
                outcome = 'aborted';
                return;
              }
              // Nothing reached the client yet, so this counts as failing before the first byte.
              this.markFailing(replica, `stopped mid-answer: ${(err as Error).message}`, caller.log);
              // An answer cut by the gateway's own limits is not sent again: it would only run into them again.
              if (attempt === 0 && !(err instanceof AnswerCut)) continue;
              sendError(res, midAnswer(target.model.name, err));
              return;
            }
            usage = usageOfAnswer(whole);
            firstAt = headersAt;
            res.writeHead(status, { ...headers, 'content-length': String(whole.length) });
            res.end(whole);
            outcome = status < 400 ? 'ok' : 'error';
            return;
          }
          res.writeHead(status, headers);
          // Streams get their headers at once: a client waits on them before its first token.
          if (sse) res.flushHeaders();
          const tap = sse ? new SseTap(!clientWantsUsage) : new JsonTap();
          try {
            // Not pipeline(upstream, tap, res): on a replica's failure that destroys the client's response too,
            // so the client would hear no reason and the failure would count as the client leaving. The client
            // going away is what the departure says (it aborts the upstream request, ending the relay).
            await relay(upstream, res, tap);
            outcome = status < 400 ? 'ok' : 'error';
          } catch (err) {
            if (abort.aborted || res.destroyed) {
              outcome = res.writableFinished ? 'ok' : 'aborted';
            } else {
              // The replica went away mid-answer: the client hears it as an error, and nobody retries it (bytes
              // already reached the client).
              this.markFailing(replica, `stopped mid-answer: ${(err as Error).message}`, caller.log);
              if (sse && !res.writableEnded) sendError(res, midAnswer(target.model.name, err));
              else res.destroy();
            }
          }
          // What the client got, also when it (or the replica) left before the engine's usage came. (A replica's
          // refusal, 4xx or 5xx, never reaches here: it was answered above in the gateway's words.)
          usage = tap.accounted(() => estimatePromptTokens(body));
          firstAt = tap instanceof SseTap ? tap.firstEventAt : tap.firstByteAt;
          return;
        } catch (err) {
          if (abort.aborted) {
            outcome = 'aborted';
            return;
          }
          if (err instanceof UpstreamUnreached) {
            this.markFailing(replica, err.message, caller.log);
            continue;
          }
          if (err instanceof ApiError) return void sendError(res, err);
          throw err;
        } finally {
          unwatch?.();
          this.inFlight.set(replica.id, Math.max(0, (this.inFlight.get(replica.id) ?? 1) - 1));
        }
      }
      if (refusedBy) {
        const stopped = this.routes.lookup(target.model.name)?.model.mode === 'STOPPED';
        return stopped
          ? unavailable(
              `${target.model.name} was stopped by an operator: it serves no requests until it is started again`,
              60,
            )
          : unavailable(`${target.model.name} is not serving just now: ${refusedBy}; try again shortly`, 5);
      }
      // Every replica failed before the first byte: a fallback may answer in its place.
      return new ApiError(
        502,
        `No replica of ${target.model.name} answered (the last ${replica ? this.failing.get(replica.id)?.why : 'could not be reached'}); try again shortly.`,
        'server_error',
        null,
        null,
        { 'retry-after': '5' },
      );
    } finally {
      res.off('close', gone);
      // A long answer keeps its model awake to its end: idle time counts from when the last request ended.
      this.usage.touch(target.model.name);
      this.usage.record({
        at,
        tokenId: caller.tokenId,
        userId: caller.userId,
        model: target.model.name,
        adapter: target.adapter?.name ?? '',
        node: replica?.nodeName ?? '',
        replicaId: replica?.id ?? '',
        outcome,
        promptTokens: usage?.promptTokens ?? 0,
        completionTokens: usage?.completionTokens ?? 0,
        cachedTokens: usage?.cachedTokens ?? 0,
        ttftMs: firstAt === null ? null : firstAt - started,
        durationMs: performance.now() - started,
        requestId: caller.requestId,
      });
      caller.limit?.charge(usage);
    }
  }

  /**
   * A READY replica holding the name; undefined when none is. With a `key` (affinity.ts), the one the model's hash
   * ring names for it unless that one carries more than HANGAR_GATEWAY_LOAD_FACTOR times the mean (then the next on
   * the ring); without, the least busy (ties taken in turn).
   */
  private pick(target: Target, skip: ReadonlySet<string> = new Set(), key?: number): RouteReplica | undefined {
    const model = this.routes.lookup(target.model.name)?.model ?? target.model;
    const now = Date.now();
    const ready = model.replicas.filter(
      (r) =>
        r.state === 'READY' &&
        r.endpoint &&
        r.engineKey &&
        !skip.has(r.id) &&
        (!target.adapter || r.adapters.has(target.adapter.name)),
    );
    // A replica that just failed is used only when nothing else is.
    const healthy = ready.filter((r) => (this.failing.get(r.id)?.until ?? 0) <= now);
    const pool = healthy.length ? healthy : ready;
    if (!pool.length) return undefined;
    if (key !== undefined && pool.length > 1) {
      const all = model.replicas;
      let ring = this.rings.get(all);
      if (!ring) {
        // Every replica the catalog runs, ready or not: the ring changes only when one joins or leaves.
        ring = new HashRing(all.map((r) => r.id));
        this.rings.set(all, ring);
      }
      let total = 0;
      for (const r of pool) total += this.inFlight.get(r.id) ?? 0;
      const i = ring.pick(
        key,
        loadBound(total, pool.length, this.deps.config.gatewayLoadFactor),
        (i) => pool.includes(all[i]!),
        (i) => this.inFlight.get(all[i]!.id) ?? 0,
      );
      if (i >= 0) return all[i];
    }
    let least = Number.POSITIVE_INFINITY;
    for (const r of pool) least = Math.min(least, this.inFlight.get(r.id) ?? 0);
    const tied = pool.filter((r) => (this.inFlight.get(r.id) ?? 0) === least);
    return tied[this.turn++ % tied.length];
  }

  private markFailing(replica: RouteReplica, why: string, log: Logger = this.deps.log) {
    this.failing.set(replica.id, { until: Date.now() + FAILING_MS, why });
    log.warn('gateway: a replica failed a request; others get the next ones', {
      replicaId: replica.id,
      node: replica.nodeName,
      why,
    });
  }

  /**
   * Waits for a replica of the target to be READY (waking an on-demand model), up to HANGAR_GATEWAY_WAKE_SECONDS.
   * Resolves to the replica, or to the 503 to answer with the fleet's reason; undefined when the client left.
   */
  private async waitFor(
    target: Target,
    caller: Caller,
    gone: Departure,
    key?: number,
  ): Promise<RouteReplica | ApiError | undefined> {
    const { name } = target.model;
    const { gatewayWakeSeconds, gatewayWakeQueue } = this.deps.config;
    if (target.model.mode === 'STOPPED') {
      return unavailable(`${name} is stopped by an operator: it serves no requests until it is started again`, 60);
    }
    const waiting = this.waiting(name);
    if (waiting >= gatewayWakeQueue) {
      return unavailable(
        `${waiting} requests already wait for ${name} to start, the most this server holds (HANGAR_GATEWAY_WAKE_QUEUE); try again shortly`,
        5,
      );
    }
    // One caller may hold a quarter of the queue at most, so that one flooding it leaves room for at least three
    // others: a fixed share, not one computed from who waits now, because a request already waiting cannot be
    // taken back when another caller comes.
    const share = Math.max(1, Math.floor(gatewayWakeQueue / 4));
    // By user, over all their tokens and sessions (as their connections are counted): a fresh token is no new share.
    const mine = `${name}\nuser:${caller.userId}`;
    const held = this.waitingBy.get(mine) ?? 0;
    if (held >= share) {
      return unavailable(
        `${held} of your requests already wait for ${name} to start, a caller's share of the ${gatewayWakeQueue} this server holds (a quarter of HANGAR_GATEWAY_WAKE_QUEUE); try again shortly`,
        5,
      );
    }
    this.waitingFor.set(name, waiting + 1);
    this.waitingBy.set(mine, held + 1);
    try {
      if (target.model.mode === 'ON_DEMAND') await this.wake(target.model, caller);
      const deadline = Date.now() + gatewayWakeSeconds * 1000;
      for (;;) {
        const current = this.routes.lookup(target.adapter?.name ?? name);
        if (!current) return modelNotFound(target.adapter?.name ?? name);
        const picked = this.pick(current, undefined, key);
        if (picked) return picked;
        const why = whyNotReady(current);
        if (why.final) return unavailable(`${name} cannot start: ${why.text}`, 30);
        if (current.model.mode === 'STOPPED') return unavailable(`${name} was stopped by an operator`, 60);
        if (Date.now() >= deadline) {
          return unavailable(
            `${target.adapter?.name ?? name} did not become ready within ${gatewayWakeSeconds} s (HANGAR_GATEWAY_WAKE_SECONDS): ${why.text}`,
            10,
          );
        }
        // A waiting request is a request: the idle clock must not run out (and the placement pass stop the
        // replica it waits for) while a model takes longer to load than its idle time.
        this.usage.touch(name);
        try {
          await sleep(250, gone.signal);
        } catch {
          return undefined;
        }
        await this.routes.refresh();
      }
    } finally {
      const left = (this.waitingFor.get(name) ?? 1) - 1;
      if (left > 0) this.waitingFor.set(name, left);
      else this.waitingFor.delete(name);
      const mineLeft = (this.waitingBy.get(mine) ?? 1) - 1;
      if (mineLeft > 0) this.waitingBy.set(mine, mineLeft);
      else this.waitingBy.delete(mine);
    }
  }

  /**
   * Wakes an on-demand model that is asleep, through the catalog (which places its replica), then reads the routes
   * again. Unlike an operator's wake, one that is awake already is left as it is: each request's usage moves its
   * timer on (usage.ts), and a burst of requests is one wake in the audit, not one per request.
   */
  private async wake(model: RouteModel, caller: Caller) {
    const woken = await this.deps.catalog.wakeIfAsleep(
      { viewer: caller.viewer, requestId: caller.requestId ?? randomUUID() },
      model,
      { why: 'woken by a request' },
    );
    if (woken)
      (caller.log ?? this.deps.log).info('gateway: woke an on-demand model for a request', { model: model.name });
    await this.routes.refresh();
  }
}

/** The error a client hears when a replica's answer ended early: the gateway's own limit named, when it was that. */
function midAnswer(model: string, err: unknown): ApiError {
  const why = err instanceof AnswerCut ? `: ${err.message}` : '.';
  return new ApiError(502, `The replica serving ${model} stopped mid-answer${why}`, 'server_error');
}
