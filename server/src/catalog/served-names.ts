import type { Viewer } from '../auth/viewer.js';
import type { Db, Tx } from '../db/client.js';
import { installTriggers } from '../db/triggers.js';
import { ConflictError, fail, ok, type Result } from '../lib/errors.js';
import { type OrgService, publicSight, type Sight, sees } from '../org/org.service.js';

// Models and adapters share one namespace: a request at /v1 names one or the other. Were a model allowed an
// adapter's name (or the reverse), whoever served it would answer the owner's requests for their adapter, on a
// node they chose. Each CatalogModel and Adapter row claims its name in ServedName (prisma/schema.prisma), whose
// primary key refuses a second claimant however close the race; a read before the write only makes the usual
// refusal quick and friendly, the constraint is what holds.
//
// The claim is made by a trigger, in the statement that writes the row, so no writer (serveMirrorVersion,
// publishTrainJob, hangar.yaml, a script on the database) can forget it. Installed at every start, as
// model-events.ts is and for its reason: Prisma's engine replays migrations split at every semicolon, and a
// PL/pgSQL body is full of them. The migration that made the table (20261207120100_served_names) claimed the
// names of the rows already there.

const FUNCTION = `
CREATE OR REPLACE FUNCTION hangar_claim_served_name() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    IF NEW.name = OLD.name THEN
      RETURN NULL;
    END IF;
    DELETE FROM "ServedName" WHERE "modelId" = OLD.id OR "adapterId" = OLD.id;
  END IF;
  IF TG_TABLE_NAME = 'CatalogModel' THEN
    INSERT INTO "ServedName" (name, kind, "modelId") VALUES (NEW.name, 'MODEL', NEW.id);
  ELSE
    INSERT INTO "ServedName" (name, kind, "adapterId") VALUES (NEW.name, 'ADAPTER', NEW.id);
  END IF;
  RETURN NULL;
END
$$ LANGUAGE plpgsql`;

const TABLES = ['CatalogModel', 'Adapter'] as const;
const LOCK = 0x6e616d65; // 'name'

export async function installServedNames(db: Db): Promise<void> {
  await installTriggers(db, {
    lock: LOCK,
    functions: [FUNCTION],
    triggers: TABLES.map((table) => ({
      name: `${table}_served_name`,
      table,
      create: `CREATE TRIGGER "${table}_served_name" AFTER INSERT OR UPDATE OF name ON "${table}" FOR EACH ROW EXECUTE FUNCTION hangar_claim_served_name()`,
    })),
  });
}

// The unique indexes a second claimant of a name runs into: its own table's (two models, two adapters) or the
// shared one (a model and an adapter).
const NAME_INDEXES = ['ServedName_pkey', 'CatalogModel_name_key', 'Adapter_name_key'];

/** Whether a write was refused because another model or adapter holds the name (Prisma's P2002 on a name index). */
export function isNameClash(err: unknown): boolean {
  if ((err as { code?: unknown })?.code !== 'P2002') return false;
  const meta = JSON.stringify((err as { meta?: unknown }).meta ?? {});
  return NAME_INDEXES.some((index) => meta.includes(`"${index}"`));
}

/** Who holds a name: a model, or an adapter and the model it runs on, each with its owner key (null: everyone's). */
export type NameHolder =
  | { kind: 'MODEL'; name: string; owner: string | null }
  | { kind: 'ADAPTER'; name: string; owner: string | null; model: { name: string; owner: string | null } };

type Owners = Pick<OrgService, 'sightOf' | 'formatOwner'>;

export class ServedNames {
  private readonly db: Db;
  private readonly owners: Owners;

  constructor(deps: { db: Db; owners: Owners }) {
    this.db = deps.db;
    this.owners = deps.owners;
  }

  async holder(name: string, db: Tx = this.db): Promise<NameHolder | null> {
    const row = await db.servedName.findUnique({
      where: { name },
      include: { model: true, adapter: { include: { model: true } } },
    });
    if (row?.model) return { kind: 'MODEL', name, owner: row.model.owner };
    if (row?.adapter) {
      const { model } = row.adapter;
      return { kind: 'ADAPTER', name, owner: row.adapter.owner, model: { name: model.name, owner: model.owner } };
    }
    return null;
  }

  /** The holder in words, owner included: for those who may see it (and the site's own hangar.yaml). */
  async describe(h: NameHolder): Promise<string> {
    const owned = h.owner ? ` (owned by ${await this.owners.formatOwner(h.owner)})` : '';
    return h.kind === 'MODEL'
      ? `the catalog already has a model named ${h.name}${owned}`
      : `${h.name} is already ${h.model.name}'s adapter${owned}`;
  }

  /**
   * Why `name` cannot be had, as this caller may be told it, ending with `todo` (what to do instead); null when
   * the name is free. The holder is named only to a caller who may call it at /v1 (org-owners.ts `sees`): to
   * anyone else an owned adapter's name is only "taken", which the shared namespace cannot help saying.
   */
  async refusal(viewer: Viewer, name: string, todo: string, db: Tx = this.db): Promise<ConflictError | null> {
    const h = await this.holder(name, db);
    if (!h) return null;
    const sight = await this.sightOf(viewer);
    const visible = sees(sight, h.owner) && (h.kind === 'MODEL' || sees(sight, h.model.owner));
    return new ConflictError(visible ? `${await this.describe(h)}: ${todo}` : `the name ${name} is taken: ${todo}`);
  }

  /**
   * Runs a write that claims `name` (creates a model or an adapter under it). When the database refuses it
   * because another claimant got there first, the answer is the refusal that claimant's name earns.
   */
  async claim<T>(viewer: Viewer, name: string, todo: string, write: () => Promise<T>): Promise<Result<T>> {
    try {
      return ok(await write());
    } catch (err) {
      if (!isNameClash(err)) throw err;
      // Gone again already (removed in between): still refused, as the write was.
      return fail((await this.refusal(viewer, name, todo)) ?? new ConflictError(`the name ${name} is taken: ${todo}`));
    }
  }

  private sightOf(viewer: Viewer): Promise<Sight> {
    // Hangar's own passes (a serve job's steps) write what others read in the job: they are told what anyone is.
    return viewer.kind === 'system' ? Promise.resolve(publicSight()) : this.owners.sightOf(viewer);
  }
}
