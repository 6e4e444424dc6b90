import type { Cache, CacheExchangeOpts, Data } from '@urql/exchange-graphcache';
import schema from '../generated/schema.json';
import { type AuditFilterValues, matchesAuditFilter } from './audit-match';
import { graphql, type ResultOf } from './graphql';

// Graphcache normalizes by `__typename:id`; entities that arrive by subscription or as a mutation's result update
// every view that shows them. Only a *new* entity needs an updater, to say which lists it joins.

type SchemaType = { kind: string; name: string; fields?: { name: string }[] | null };
const roots = new Set(['Query', 'Mutation', 'Subscription']);

/**
 * Object types without an `id` (Viewer, PageInfo, connections and edges, payloads, errors, GPU reports…) have no
 * identity of their own: they are stored inside their parent. Read from the schema, so new types need no entry.
 */
export const embeddedTypes: string[] = (schema.__schema.types as SchemaType[])
  .filter((t) => t.kind === 'OBJECT' && !roots.has(t.name) && !t.fields?.some((f) => f.name === 'id'))
  .map((t) => t.name);

const byId = (data: Data) => (data.id == null ? null : String(data.id));

/** Takes the entity with this name out of every cached list of the field (the answer names it, not its id). */
function dropFromListsByName(cache: Cache, field: string, name: string) {
  for (const f of cache.inspectFields('Query')) {
    if (f.fieldName !== field) continue;
    const list = cache.resolve('Query', f.fieldKey);
    if (!Array.isArray(list)) continue;
    const keys = list as unknown as string[];
    cache.link(
      'Query',
      f.fieldName,
      f.arguments,
      keys.filter((k) => cache.resolve(k, 'name') !== name),
    );
  }
}

/** Adds an entity to every cached list `Query.<field>(…)` that does not hold it yet. */
function addToLists(cache: Cache, field: string, entity: Data, at: 'start' | 'end') {
  const key = cache.keyOfEntity(entity);
  if (!key) return;
  for (const f of cache.inspectFields('Query')) {
    if (f.fieldName !== field) continue;
    const list = cache.resolve('Query', f.fieldKey);
    if (!Array.isArray(list)) continue;
    const keys = list as unknown as string[];
    if (keys.includes(key)) continue;
    cache.link('Query', f.fieldName, f.arguments, at === 'start' ? [key, ...keys] : [...keys, key]);
  }
}

/**
 * A model as an event has it now, in every cached `models` list (the server's is by name): a new one is put in its
 * place by name, a removed one (model null: only its id is left) leaves.
 */
function placeModel(cache: Cache, modelId: string, model: Data | null) {
  const key = cache.keyOfEntity({ __typename: 'Model', id: modelId });
  if (!key) return;
  for (const f of cache.inspectFields('Query')) {
    if (f.fieldName !== 'models') continue;
    const list = cache.resolve('Query', f.fieldKey);
    if (!Array.isArray(list)) continue;
    const keys = (list as unknown as string[]).filter((k) => k !== key);
    if (model) {
      const name = String(model.name);
      const at = keys.findIndex((k) => String(cache.resolve(k, 'name')) > name);
      keys.splice(at < 0 ? keys.length : at, 0, key);
    }
    cache.link('Query', f.fieldName, f.arguments, keys);
  }
}

// The updaters' own views of the lists they change, only the fields they decide with: graphcache writes links
// through them and leaves every other field as the views' queries and the events wrote it. So this file imports no
// component, and a component's query can select more without this file changing.

const TrainJobsPage = graphql(`
  query Cache_TrainJobsPage($state: JobState, $first: Int!, $after: String) {
    trainJobs(state: $state, first: $first, after: $after) {
      edges {
        __typename
        cursor
        node {
          __typename
          id
          state
          createdAt
        }
      }
      pageInfo {
        hasNextPage
      }
    }
  }
`);

const AuditEventsPage = graphql(`
  query Cache_AuditEventsPage($first: Int!, $after: String, $filter: AuditFilter) {
    auditEvents(first: $first, after: $after, filter: $filter) {
      edges {
        __typename
        cursor
        node {
          __typename
          id
        }
      }
    }
  }
`);

type TrainJobEntity = ResultOf<typeof TrainJobsPage>['trainJobs']['edges'][number]['node'];
type AuditEventEntity = { __typename: 'AuditEvent'; id: string } & Parameters<typeof matchesAuditFilter>[0];

/** Every cached page of the training list, with the variables it was read with (null arguments are not stored). */
function trainJobPages(cache: Cache) {
  return cache
    .inspectFields('Query')
    .filter((f) => f.fieldName === 'trainJobs' && typeof f.arguments?.first === 'number')
    .map((f) => ({
      state: (f.arguments?.state ?? null) as TrainJobEntity['state'] | null,
      first: f.arguments?.first as number,
      after: (f.arguments?.after ?? null) as string | null,
    }));
}

/**
 * A job as it is now, in the training list's cached pages: newest first, so a job the first page does not hold
 * (new, or just now in the state the list is filtered to) goes where its creation time puts it; a job no longer
 * in the filtered state leaves. Later pages keep their rows: they were read by cursor and are re-read on a visit.
 */
function placeTrainJob(cache: Cache, job: TrainJobEntity) {
  for (const variables of trainJobPages(cache)) {
    if (variables.after !== null) continue;
    cache.updateQuery({ query: TrainJobsPage, variables }, (data) => {
      if (!data) return data;
      const edges = data.trainJobs.edges;
      const at = edges.findIndex((e) => e.node.id === job.id);
      const belongs = variables.state === null || variables.state === job.state;
      if (at >= 0 && !belongs) edges.splice(at, 1);
      if (at >= 0 || !belongs) return data;
      const older = edges.findIndex(
        (e) => e.node.createdAt < job.createdAt || (e.node.createdAt === job.createdAt && e.node.id < job.id),
      );
      // Older than every row of a page that has more after it: it belongs on a later page.
      if (older < 0 && data.trainJobs.pageInfo.hasNextPage) return data;
      const node = { __typename: 'TrainJob' as const, id: job.id, state: job.state, createdAt: job.createdAt };
      const edge = { __typename: 'TrainJobEdge' as const, cursor: job.id, node };
      edges.splice(older < 0 ? edges.length : older, 0, edge);
      return data;
    });
  }
}

const removedVersion = graphql(`
  fragment _ on MirrorVersion {
    id
    removed
  }
`);

/** The mutation's result when it is the success type, else undefined (a refusal changes no list). */
function success(parent: Record<string, unknown>, field: string, typename: string): Data | undefined {
  const result = parent[field] as Data | null | undefined;
  return result?.__typename === typename ? result : undefined;
}

export const cacheConfig: CacheExchangeOpts = {
  schema: schema as CacheExchangeOpts['schema'],
  keys: {
    ...Object.fromEntries(embeddedTypes.map((t) => [t, () => null])),
    AuditEvent: byId,
    ApiToken: byId,
    User: byId,
    Node: byId,
    // "model/version": the same version whether it comes from the listing, a mutation or a subscription event.
    MirrorVersion: byId,
    MirrorFile: byId,
    RemovedMirrorVersion: byId,
    // The catalog: a model, its replicas and adapters, each by id; a mutation's result updates its card in place.
    Model: byId,
    Replica: byId,
    Adapter: byId,
    // A serve job's subscription sends the whole job each time: its steps update by id.
    ServeJob: byId,
    ServeJobStep: byId,
    // A training job's subscription sends the whole job each time: its row and its page update by id.
    TrainJob: byId,
    TrainEvent: byId,
    DeletedTrainJob: byId,
    // The registry's answers are views, not entities: a set's id ("model:Q4_K_M") is unique only within its
    // repository, and a repository's sets change with the `context` asked for. Each stays inside the query that
    // read it, so nothing is merged across repositories or contexts.
    RegistryModel: () => null,
    RegistryRepo: () => null,
    FileSet: () => null,
  },
  updates: {
    Mutation: {
      login(parent, _args, cache) {
        if (success(parent, 'login', 'LoginPayload')) cache.invalidate('Query', 'viewer');
      },
      createApiToken(parent, _args, cache) {
        const created = success(parent, 'createApiToken', 'CreatedApiToken');
        // The server lists active tokens first, newest first.
        if (created) addToLists(cache, 'apiTokens', created.token as Data, 'start');
      },
      createNode(parent, _args, cache) {
        const created = success(parent, 'createNode', 'CreatedNode');
        if (created) addToLists(cache, 'nodes', created.node as Data, 'end');
      },
      // The answer names the node: it leaves the cached list by name, and the models whose replicas it held are
      // read again (those replicas are gone, placed elsewhere).
      removeNode(parent, _args, cache) {
        const removed = success(parent, 'removeNode', 'RemovedNode');
        if (!removed) return;
        dropFromListsByName(cache, 'nodes', removed.name as string);
        cache.invalidate('Query', 'models');
      },
      createUser(parent, _args, cache) {
        const user = success(parent, 'createUser', 'User');
        if (user) addToLists(cache, 'users', user, 'end');
      },
      // The mirror's listing is not in graphcache (thousands of versions): the Mirror page keeps it, and places
      // what fetchToMirror, fetchRepoSet and mirrorChanged answer itself (components/mirror/mirror-listing.tsx).
      // As the subscription's last event about it would: every view drops a removed version, even without a socket.
      removeMirrorVersion(parent, _args, cache) {
        const removed = success(parent, 'removeMirrorVersion', 'RemovedMirrorVersion');
        if (removed) cache.writeFragment(removedVersion, { id: String(removed.id), removed: true });
      },
      // A new catalog model joins the Models page's list; the version's "used by" is read again from the server.
      serveMirrorVersion(parent, args, cache) {
        const placed = success(parent, 'serveMirrorVersion', 'ServePlaced');
        if (!placed) return;
        addToLists(cache, 'models', placed.model as Data, 'end');
        cache.invalidate({ __typename: 'MirrorVersion', id: `${args.model}/${args.version}` }, 'usedBy');
      },
      // The answer names the model, not its id: it leaves every cached list by name. (The mirror's "used by" is
      // read again with its listing, on the Mirror page's next visit.)
      removeModel(parent, _args, cache) {
        const removed = success(parent, 'removeModel', 'RemovedModel');
        if (removed) dropFromListsByName(cache, 'models', removed.name as string);
      },
      // The answer is only the new job's id: the training list is read again where it is cached.
      createTrainJob(parent, _args, cache) {
        if (!success(parent, 'createTrainJob', 'TrainJob')) return;
        for (const f of cache.inspectFields('Query'))
          if (f.fieldName === 'trainJobs') cache.invalidate('Query', f.fieldName, f.arguments);
      },
      // The job leaves every page of the list; its own page is left as it was, for the moment before it navigates.
      deleteTrainJob(parent, _args, cache) {
        const deleted = success(parent, 'deleteTrainJob', 'DeletedTrainJob');
        if (!deleted) return;
        for (const variables of trainJobPages(cache)) {
          cache.updateQuery({ query: TrainJobsPage, variables }, (data) => {
            if (!data) return data;
            data.trainJobs.edges = data.trainJobs.edges.filter((e) => e.node.id !== deleted.id);
            return data;
          });
        }
      },
      // The answer names no job: the job's adapter is read again (its new event comes with the job's next live
      // update), and so are the catalog's models, which list it. Only a nullable field is invalidated: the page
      // keeps showing the job while it is read.
      publishTrainJob(parent, args, cache) {
        if (!success(parent, 'publishTrainJob', 'TrainJobPublished')) return;
        cache.invalidate({ __typename: 'TrainJob', id: String(args.id) }, 'adapter');
        cache.invalidate('Query', 'models');
      },
    },
    Subscription: {
      trainJobChanged(parent, _args, cache) {
        const job = parent.trainJobChanged as TrainJobEntity | null;
        if (job) placeTrainJob(cache, job);
      },
      modelChanged(parent, _args, cache) {
        const change = parent.modelChanged as { modelId?: string; model?: Data | null } | null;
        if (change?.modelId) placeModel(cache, change.modelId, change.model ?? null);
      },
      // A new event goes on top of every cached first page (later pages are fetched by cursor and stay put).
      auditEventAdded(parent, _args, cache) {
        const event = parent.auditEventAdded as AuditEventEntity | null;
        if (!event) return;
        for (const f of cache.inspectFields('Query')) {
          const first = f.arguments?.first;
          if (f.fieldName !== 'auditEvents' || f.arguments?.after != null || typeof first !== 'number') continue;
          // A filtered list takes only the events its filter would have given it.
          const filter = (f.arguments?.filter ?? null) as AuditFilterValues | null;
          if (!matchesAuditFilter(event, filter)) continue;
          cache.updateQuery({ query: AuditEventsPage, variables: { first, after: null, filter } }, (data) => {
            if (!data || data.auditEvents.edges.some((e) => e.node.id === event.id)) return data;
            const node = { __typename: 'AuditEvent' as const, id: event.id };
            data.auditEvents.edges.unshift({ __typename: 'AuditEventEdge', cursor: event.id, node });
            return data;
          });
        }
      },
    },
  },
};
