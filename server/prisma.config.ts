import { defineConfig } from 'prisma/config';

// Only `prisma generate` reads this: migrations are applied by the server (src/db/migrate.ts).
export default defineConfig({
  schema: '../prisma/schema.prisma',
});
