import { lexicographicSortSchema } from 'graphql';
import { builder } from './builder.js';
import './scalars.js';
import './errors.js';
import '../access/access.schema.js';
import '../auth/auth.schema.js';
import '../audit/audit.schema.js';
import '../fleet/fleet.schema.js';
import '../mirror/mirror.schema.js';
import '../registry/registry.schema.js';
import '../catalog/catalog.schema.js';
import '../serve/serve-job.schema.js';
import '../org/org.schema.js';
import '../train/train.schema.js';
import '../gateway/usage.schema.js';

export const schema = builder.toSchema({ sortSchema: false });
export const sortedSchema = () => lexicographicSortSchema(schema);
