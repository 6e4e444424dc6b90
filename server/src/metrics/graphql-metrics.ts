import { createCounter, createHistogram, usePrometheus } from '@graphql-yoga/plugin-prometheus';
import type { Plugin } from 'graphql-yoga';
import type { Registry } from 'prom-client';
import { KNOWN_OPERATIONS } from './known-operations.js';

// Yoga's Prometheus figures, with every label from a bounded set. The plugin's own labels were the operation
// name and the full URL with its query string, both the caller's text: 12,000 anonymous requests with names of
// their own made 342,390 series (a 47 MB scrape, 773 MiB of memory), and any viewer's scrape showed other users'
// GET query strings. Here an operation is named only when it is one of Hangar's own clients' documents
// (known-operations.ts, written by `pnpm generate`), an HTTP status is its class, and there is no URL, no error
// path (aliases are the caller's text too), no query text and no variables.

const KNOWN = new Set(KNOWN_OPERATIONS);
const OPERATION_TYPES = new Set(['query', 'mutation', 'subscription']);
const PHASES = new Set(['parse', 'validate', 'context', 'execute', 'subscribe']);

type Described = { operationName?: string; operationType?: string };

/** The console's, the CLI's or the agent's name for a document; "other" for any name a caller made up. */
export function operationLabel(name: string | undefined): string {
  return name && KNOWN.has(name) ? name : 'other';
}

function operationLabels(p: Described) {
  return {
    operationName: operationLabel(p.operationName),
    operationType: p.operationType && OPERATION_TYPES.has(p.operationType) ? p.operationType : 'unknown',
  };
}

/**
 * Requests, their duration (over HTTP and in execution) and errors, by operation. The per-phase parse, validate
 * and context histograms are left off: each is one more observation on every request, and a slow parse shows in
 * the request's duration anyway. /metrics is served by the HTTP edge, not by Yoga.
 */
export function graphqlMetrics(registry: Registry): Plugin {
  // The phases each metric observes are the plugin's own defaults, spelled out: a metric given as an object
  // must name them.
  const histogram = <P extends 'execute' | 'subscribe'>(name: string, help: string, phases: [P, ...P[]]) =>
    createHistogram({
      registry,
      histogram: { name, help, labelNames: ['operationType', 'operationName'] as const },
      fillLabelsFn: operationLabels,
      phases,
    });
  return usePrometheus({
    registry,
    endpoint: false,
    metrics: {
      graphql_envelop_request: createCounter({
        registry,
        counter: {
          name: 'graphql_envelop_request',
          help: 'GraphQL operations executed, by operation (Hangar\'s own documents by name, any other as "other")',
          labelNames: ['operationType', 'operationName'] as const,
        },
        fillLabelsFn: operationLabels,
        phases: ['execute', 'subscribe'],
      }),
      graphql_envelop_request_duration: histogram(
        'graphql_envelop_request_duration',
        'Time spent on running the GraphQL operation from parse to execute',
        ['execute', 'subscribe'],
      ),
      graphql_envelop_phase_execute: histogram(
        'graphql_envelop_phase_execute',
        'Time spent on running the GraphQL "execute" function',
        ['execute'],
      ),
      graphql_envelop_phase_subscribe: histogram(
        'graphql_envelop_phase_subscribe',
        'Time spent on running the GraphQL "subscribe" function',
        ['subscribe'],
      ),
      graphql_envelop_error_result: createCounter({
        registry,
        counter: {
          name: 'graphql_envelop_error_result',
          help: 'Errors in GraphQL results, by operation and the phase that raised them',
          labelNames: ['operationType', 'operationName', 'phase'] as const,
        },
        fillLabelsFn: (p: Described & { errorPhase?: string }) => ({
          ...operationLabels(p),
          phase: p.errorPhase && PHASES.has(p.errorPhase) ? p.errorPhase : 'other',
        }),
        phases: ['parse', 'validate', 'context', 'execute', 'subscribe'],
      }),
      graphql_yoga_http_duration: createHistogram({
        registry,
        histogram: {
          name: 'graphql_yoga_http_duration',
          help: 'Time spent on the HTTP request, by operation, method and status class (2xx, 4xx, 5xx)',
          labelNames: ['operationType', 'operationName', 'method', 'statusClass'] as const,
        },
        fillLabelsFn: (p: Described & { request: Request; response: Response }) => ({
          ...operationLabels(p),
          method: p.request.method === 'GET' || p.request.method === 'POST' ? p.request.method : 'other',
          statusClass: `${Math.floor(p.response.status / 100)}xx`,
        }),
        phases: ['request'],
      }),
      graphql_envelop_phase_parse: false,
      graphql_envelop_phase_validate: false,
      graphql_envelop_phase_context: false,
      graphql_envelop_request_time_summary: false,
      graphql_envelop_deprecated_field: false,
      graphql_envelop_schema_change: false,
    },
  });
}
