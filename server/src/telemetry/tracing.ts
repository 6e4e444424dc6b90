import type { IncomingMessage, ServerResponse } from 'node:http';
import { useOpenTelemetry } from '@envelop/opentelemetry';
import type { Logger } from '@hangar/common/log';
import { type Span, SpanKind, SpanStatusCode } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor, ConsoleSpanExporter, TracerProvider } from '@opentelemetry/sdk-trace';
import type { Plugin } from 'graphql-yoga';
import type { Config } from '../config.js';
import type { UsageEvent } from '../gateway/usage.js';

// Traces for sites that run a collector: a span per GraphQL operation (envelop's OpenTelemetry plugin) and one
// per gateway call under /v1, with the model, the status and the tokens, in OpenTelemetry's GenAI names so a
// collector's dashboards read them without a mapping. Nothing here runs unless config.tracing is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER): with it unset no provider or exporter exists at all.

export type Tracing = {
  /** The GraphQL plugin: one span per operation, named by it; resolvers are not traced (one span per field). */
  graphqlPlugin(): Plugin;
  /**
   * Runs a /v1 call inside its span; the span ends when the call's answer has been sent. `requestId` is the
   * edge's id for the call: the usage the gateway records for it names the same (UsageEvent.requestId).
   */
  gatewayCall(
    req: IncomingMessage,
    res: ServerResponse,
    path: string,
    requestId: string,
    handle: () => Promise<void>,
  ): Promise<void>;
  /** What the gateway accounted for a call still running (usage.ts calls it as the call ends): on its span. */
  describeGatewayCall(e: UsageEvent): void;
  /** Sends what is still queued, then stops: spans of the last requests reach the collector on SIGTERM. */
  stop(): Promise<void>;
};

export function startTracing(config: NonNullable<Config['tracing']>, log: Logger): Tracing {
  const exporter = config.exporter === 'otlp' ? new OTLPTraceExporter({ url: config.url }) : new ConsoleSpanExporter();
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ 'service.name': config.serviceName }),
    spanProcessors: [new BatchSpanProcessor({ exporter })],
  });
  const tracer = provider.getTracer('hangar');
  // The gateway's span of each call still running, by its request id, found again by describeGatewayCall: usage
  // is recorded deep in the call and names its request, and the gateway need not know tracing exists. A map, not
  // an AsyncLocalStorage: on Node 20 that puts a promise hook on every promise of the process (db/client.ts).
  const open = new Map<string, Span>();
  log.info('tracing: sending spans', config.exporter === 'otlp' ? { to: config.url } : { to: 'stdout' });

  return {
    graphqlPlugin: () =>
      // Neither variables nor results: they hold tokens, passwords and e-mail addresses, and spans leave the site.
      useOpenTelemetry(
        { resolvers: false, variables: false, result: false, document: true },
        provider,
        SpanKind.SERVER,
        {},
        config.serviceName,
      ) as Plugin,
    gatewayCall: (req, res, path, requestId, handle) =>
      tracer.startActiveSpan(
        `${req.method} /v1${path.slice('/v1'.length)}`,
        { kind: SpanKind.SERVER, attributes: { 'http.request.method': req.method ?? '', 'url.path': path } },
        async (span) => {
          open.set(requestId, span);
          try {
            await handle();
          } catch (err) {
            span.recordException(err as Error);
            throw err;
          } finally {
            open.delete(requestId);
            span.setAttribute('http.response.status_code', res.statusCode);
            if (res.statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
            span.end();
          }
        },
      ),
    describeGatewayCall: (e) => {
      const span = e.requestId === undefined ? undefined : open.get(e.requestId);
      if (!span) return;
      span.setAttributes({
        'gen_ai.request.model': e.model,
        'gen_ai.usage.input_tokens': e.promptTokens,
        'gen_ai.usage.output_tokens': e.completionTokens,
        'hangar.outcome': e.outcome,
        'hangar.node': e.node,
      });
      if (e.adapter) span.setAttribute('hangar.adapter', e.adapter);
      if (e.outcome === 'error') span.setStatus({ code: SpanStatusCode.ERROR });
    },
    stop: () => provider.shutdown(),
  };
}
