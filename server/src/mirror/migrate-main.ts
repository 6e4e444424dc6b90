import { runMirrorMigrate } from './migrate-command.js';

// The entry of `hangar mirror migrate` (bin/hangar.mjs): its own bundle, so the CLI never loads the database.
process.exit(await runMirrorMigrate(process.argv.slice(4)));
