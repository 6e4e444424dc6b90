import { Repeater } from 'graphql-yoga';
import type { Db } from '../db/client.js';
import { installTriggers } from '../db/triggers.js';
import type { PubSub } from '../pubsub.js';
import type { FleetReplicas } from './fleet-replicas.js';

// A node's serving work (nodeServingWork), pushed to its agent over the same graphql-ws socket as its training
// work (nodeTrainWork), and sent the same way: the whole list when the agent subscribes (so a reconnect catches
// up on whatever changed meanwhile), then again whenever it changes, only when it differs.
//
// What changes it is a Replica row (placed, told to stop, ended, moved) or its model (the source, the adapters).
// Replica rows are written from many places (placement, agents' reports, smoke tests, the catalog, the gateway's
// wake), so the database announces them itself, as it does the `model` event (catalog/model-events.ts): a
// trigger sends `servingWork` with the node's id in the transaction that made the change, heard on commit. A
// model's own change arrives as its `model` event; a subscription reads again on one only for the models its
// node runs.

const FUNCTION = `
CREATE OR REPLACE FUNCTION hangar_serving_work_changed() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND NEW."nodeId" IS NOT DISTINCT FROM OLD."nodeId" AND NEW.desired = OLD.desired
     AND NEW.state = OLD.state AND NEW."gpuIndex" IS NOT DISTINCT FROM OLD."gpuIndex"
     AND NEW."gpuIndexes" IS NOT DISTINCT FROM OLD."gpuIndexes" THEN
    RETURN NULL;
  END IF;
  IF TG_OP <> 'INSERT' AND OLD."nodeId" IS NOT NULL THEN
    PERFORM pg_notify('hangar_events', json_build_object('topic', 'servingWork', 'id', OLD."nodeId")::text);
  END IF;
  IF TG_OP <> 'DELETE' AND NEW."nodeId" IS NOT NULL THEN
    PERFORM pg_notify('hangar_events', json_build_object('topic', 'servingWork', 'id', NEW."nodeId")::text);
  END IF;
  RETURN NULL;
END
$$ LANGUAGE plpgsql`;

const LOCK = 0x73727677; // 'srvw'

/** Installed at every start, as the model events are (see there for why not by a migration). */
export async function installServingWorkEvents(db: Db): Promise<void> {
  await installTriggers(db, {
    lock: LOCK,
    functions: [FUNCTION],
    triggers: [
      {
        name: 'Replica_serving_work',
        table: 'Replica',
        create: `CREATE TRIGGER "Replica_serving_work" AFTER INSERT OR UPDATE OR DELETE ON "Replica" FOR EACH ROW EXECUTE FUNCTION hangar_serving_work_changed()`,
      },
    ],
  });
}

type AssignmentRow = Awaited<ReturnType<FleetReplicas['assignments']>>[number];

/** What the agent is sent of a row (the Assignment type's fields): a change elsewhere in the row is not news. */
const sent = (a: AssignmentRow) => [
  a.id,
  a.model.name,
  a.model.engine,
  a.model.source,
  a.model.contextSize,
  a.model.parallel,
  a.desired,
  a.gpuIndex,
  a.gpuIndexes,
  a.model.memoryBytes?.toString(),
  a.model.adapters.map((x) => [x.name, x.source]),
];

/** The node's assignments now, then again after every event that may change them, sent only when they differ. */
export async function* servingWorkOf(ctx: {
  viewer: { kind: string; node?: { id: string } };
  pubsub: Pick<PubSub, 'subscribe'>;
  services: { fleet: { assignments: (nodeId: string) => Promise<AssignmentRow[]> } };
}) {
  const nodeId = ctx.viewer.kind === 'node' ? ctx.viewer.node?.id : undefined;
  if (!nodeId) return;
  const events = Repeater.merge([
    ctx.pubsub.subscribe('servingWork'),
    (async function* () {
      for await (const id of ctx.pubsub.subscribe('model')) yield { model: id };
    })(),
  ])[Symbol.asyncIterator]();
  // Listening before the first read: a change committed while it runs is heard, not lost until the next one.
  let event = events.next();
  let last = '';
  let models = new Set<string>();
  const read = async () => {
    const rows = await ctx.services.fleet.assignments(nodeId);
    models = new Set(rows.map((r) => r.modelId));
    const key = JSON.stringify(rows.map(sent));
    if (key === last) return null;
    last = key;
    return { assignments: rows };
  };
  try {
    const first = await read();
    if (first) yield first;
    for (;;) {
      const e = await event;
      if (e.done) return;
      event = events.next();
      const mine = typeof e.value === 'string' ? e.value === nodeId : models.has(e.value.model);
      if (!mine) continue;
      const w = await read();
      if (w) yield w;
    }
  } finally {
    await events.return?.();
  }
}
