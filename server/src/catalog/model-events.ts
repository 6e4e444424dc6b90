import type { Db } from '../db/client.js';
import { installTriggers } from '../db/triggers.js';

// The Models page is live: a model's card changes when the model, one of its replicas or one of its adapters
// does, and those rows are written from many places (the catalog, the placement pass, agents' reports, smoke
// tests, the gateway's wake and idle clock). Triggers send the one `model` event (pubsub.ts) for all of them, in
// the transaction that made the change, so nothing that changes a model can forget to say so; NOTIFY sends a
// payload once per transaction however many rows repeat it. Writes that change nothing a card shows (the idle
// clock's lastRequestAt, a smoke test's lease) are not sent.
//
// Installed at every start rather than by a migration: the migrations are also replayed by Prisma's engine
// (pnpm migration:new, the drift test), which splits a script at every semicolon, and a PL/pgSQL body is full of
// them. Replacing the function and the triggers is idempotent, done under a lock so replicas starting at once
// do not trip over each other, and skipped when the database already has this version (db/triggers.ts).

const FUNCTION = `
CREATE OR REPLACE FUNCTION hangar_model_changed() RETURNS trigger AS $$
DECLARE
  model uuid;
  quiet text[];
BEGIN
  quiet := CASE TG_TABLE_NAME
    WHEN 'CatalogModel' THEN ARRAY['lastRequestAt', 'updatedAt']
    WHEN 'Replica' THEN ARRAY['smokeLeaseUntil', 'updatedAt']
    ELSE ARRAY[]::text[] END;
  IF TG_OP = 'UPDATE' AND (to_jsonb(NEW) - quiet) = (to_jsonb(OLD) - quiet) THEN
    RETURN NULL;
  END IF;
  IF TG_TABLE_NAME = 'CatalogModel' THEN
    model := CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END;
  ELSE
    model := CASE WHEN TG_OP = 'DELETE' THEN OLD."modelId" ELSE NEW."modelId" END;
  END IF;
  PERFORM pg_notify('hangar_events', json_build_object('topic', 'model', 'id', model)::text);
  RETURN NULL;
END
$$ LANGUAGE plpgsql`;

const TABLES = ['CatalogModel', 'Replica', 'Adapter'] as const;
const LOCK = 0x6d6f6465; // 'mode'

export async function installModelEvents(db: Db): Promise<void> {
  await installTriggers(db, {
    lock: LOCK,
    functions: [FUNCTION],
    triggers: TABLES.map((table) => ({
      name: `${table}_changed`,
      table,
      create: `CREATE TRIGGER "${table}_changed" AFTER INSERT OR UPDATE OR DELETE ON "${table}" FOR EACH ROW EXECUTE FUNCTION hangar_model_changed()`,
    })),
  });
}
