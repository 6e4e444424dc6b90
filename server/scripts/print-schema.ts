import fs from 'node:fs/promises';
import { printSchema } from 'graphql';
import { sortedSchema } from '../src/schema/index.js';

// server/schema.graphql is what scripts and the console's cache are written against; it is committed and a
// test fails when it drifts from the code.
export const schemaFile = new URL('../schema.graphql', import.meta.url);

export const printedSchema = () => `${printSchema(sortedSchema())}\n`;

if (import.meta.url === `file://${process.argv[1]}`) {
  if (process.argv.includes('--stdout')) {
    process.stdout.write(printedSchema());
  } else {
    await fs.writeFile(schemaFile, printedSchema());
    process.stdout.write(`wrote ${schemaFile.pathname}\n`);
  }
}
