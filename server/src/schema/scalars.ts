import { GraphQLError, Kind } from 'graphql';
import { builder } from './builder.js';

builder.scalarType('Bytes', {
  description: 'A size in bytes, as a JSON number (exact up to 2^53, about 9 PB).',
  serialize: (v) => {
    const n = typeof v === 'bigint' ? Number(v) : v;
    if (!Number.isSafeInteger(n)) throw new GraphQLError(`a byte count past 2^53 cannot be sent exactly: ${String(v)}`);
    return n;
  },
  parseValue: (v) => {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
      throw new GraphQLError('Bytes is a whole, non-negative number of bytes');
    }
    return v;
  },
  parseLiteral: (ast) => {
    if (ast.kind !== Kind.INT) throw new GraphQLError('Bytes is a whole, non-negative number of bytes');
    return Number(ast.value);
  },
});

builder.scalarType('Count', {
  description: 'A count (requests, tokens), as a JSON number: exact up to 2^53, where Int stops at 2^31.',
  serialize: (v) => {
    const n = typeof v === 'bigint' ? Number(v) : v;
    if (!Number.isSafeInteger(n)) throw new GraphQLError(`a count past 2^53 cannot be sent exactly: ${String(v)}`);
    return n;
  },
  parseValue: (v) => {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
      throw new GraphQLError('Count is a whole, non-negative number');
    }
    return v;
  },
  parseLiteral: (ast) => {
    if (ast.kind !== Kind.INT) throw new GraphQLError('Count is a whole, non-negative number');
    return Number(ast.value);
  },
});

builder.scalarType('DateTime', {
  description: 'An instant, as an ISO 8601 string in UTC.',
  serialize: (v) => (v instanceof Date ? v.toISOString() : new Date(String(v)).toISOString()),
  parseValue: (v) => {
    const d = new Date(String(v));
    if (typeof v !== 'string' || Number.isNaN(d.getTime())) {
      throw new GraphQLError('DateTime is an ISO 8601 string such as 2026-12-31T23:59:00Z');
    }
    return d;
  },
  parseLiteral: (ast) => {
    const d = ast.kind === Kind.STRING ? new Date(ast.value) : new Date(Number.NaN);
    if (Number.isNaN(d.getTime()))
      throw new GraphQLError('DateTime is an ISO 8601 string such as 2026-12-31T23:59:00Z');
    return d;
  },
});

builder.scalarType('JSON', {
  description: 'Free-form JSON, for details whose shape belongs to another system (a GPU report, an engine profile).',
  serialize: (v) => v,
  parseValue: (v) => v,
});
