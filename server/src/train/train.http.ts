import { createReadStream } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AuthService } from '../auth/auth.service.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { TrainArtifacts } from './artifacts.js';
import { TRAIN_MAX_DATA_BYTES } from './data.js';
import type { TrainService } from './train.service.js';

// The training routes that carry files rather than GraphQL: the pairs (up to 64 MiB, over the GraphQL body
// limit), the job's data for its node, the adapter the node uploads, and the artifacts operators download.
//
//   POST /api/train/data                               operator: NDJSON pairs → the check report (+ sha256)
//   GET  /api/train/jobs/<id>/data                     the job's node, or an operator
//   PUT  /api/train/jobs/<id>/artifacts/peft           the job's node: the adapter as a gzipped tar
//   GET  /api/train/jobs/<id>/artifacts/<kind>[/name]  any signed-in caller: peft or gguf

// Uploaded pairs are kept by their sha256 and change nothing an operator sees until createTrainJob (audited) uses them.
type Deps = { train: TrainService; artifacts: TrainArtifacts; auth: AuthService };

const JOB = /^\/api\/train\/jobs\/([0-9a-f-]{36})\/(data|artifacts\/(peft|gguf)(?:\/([^/]+))?)$/;

export function trainRoutes({ train, artifacts, auth }: Deps) {
  /** Answers with JSON; true, because every answer here means "this router served the path". */
  const reply = (res: ServerResponse, status: number, body: unknown): true => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
    return true;
  };
  const who = (req: IncomingMessage) =>
    auth.identify({
      authorization: req.headers.authorization ?? null,
      cookie: req.headers.cookie ?? null,
      csrf: (req.headers['x-hangar-csrf'] as string | undefined) ?? null,
      method: req.method ?? 'GET',
    });
  const denied = (res: ServerResponse, viewer: Viewer, need: string): true =>
    reply(res, viewer.kind === 'anonymous' ? 401 : 403, {
      error: viewer.kind === 'anonymous' ? (viewer.reason ?? `sign in or send a token: ${need}`) : need,
    });
  const operator = (v: Viewer) => (v.kind === 'user' || v.kind === 'token') && roleAtLeast(v.role, 'OPERATOR');

  /** Whether this router serves the path; then it answers. */
  return async (req: IncomingMessage, res: ServerResponse, path: string): Promise<boolean> => {
    if (path === '/api/train/data') {
      if (req.method !== 'POST') return reply(res, 405, { error: 'POST the pairs as NDJSON' });
      const viewer = await who(req);
      if (!operator(viewer)) return denied(res, viewer, 'uploading training data needs the OPERATOR role');
      const length = Number(req.headers['content-length'] ?? Number.NaN);
      if (!Number.isSafeInteger(length)) return reply(res, 411, { error: 'an upload needs a Content-Length header' });
      if (length > TRAIN_MAX_DATA_BYTES)
        return reply(res, 413, { error: `the data is ${length} bytes; at most ${TRAIN_MAX_DATA_BYTES} (64 MiB)` });
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const c of req as AsyncIterable<Buffer>) {
        size += c.length;
        if (size > TRAIN_MAX_DATA_BYTES) return reply(res, 413, { error: 'the data is over 64 MiB' });
        chunks.push(c);
      }
      // ?model=<catalog model>&max_len=<n>: token counts by that model's tokenizer too.
      const query = new URL(req.url ?? '/', 'http://hangar').searchParams;
      const maxLen = Number(query.get('max_len'));
      const report = await train.storeData(Buffer.concat(chunks).toString('utf8'), {
        model: query.get('model'),
        maxLen: Number.isInteger(maxLen) && maxLen >= 16 && maxLen <= 32768 ? maxLen : null,
      });
      return reply(res, 200, { ...report, ok: report.errorCount === 0 && report.pairs > 0 });
    }

    const m = JOB.exec(path);
    if (!m) return false;
    const [, id = '', what = '', kind, filename] = m;
    const viewer = await who(req);

    if (what === 'data') {
      if (req.method !== 'GET' && req.method !== 'HEAD') return reply(res, 405, { error: 'GET the data' });
      const job = await train.get(id);
      // The pairs may be a knowledge base's: only the node that trains on them, or an operator, reads them.
      const mayRead = job && ((viewer.kind === 'node' && viewer.node.id === job.nodeId) || operator(viewer));
      if (!mayRead)
        return job
          ? denied(res, viewer, "the data is for the job's node and operators")
          : reply(res, 404, { error: `no training job ${id}` });
      res.writeHead(200, {
        'content-type': 'application/x-ndjson',
        'content-length': String(job.dataBytes),
        etag: `"${job.dataSha256}"`,
      });
      if (req.method === 'HEAD') {
        res.end();
        return true;
      }
      createReadStream(job.dataPath)
        .on('error', () => res.destroy())
        .pipe(res);
      return true;
    }

    if (req.method === 'PUT' && kind === 'peft' && !filename) {
      if (viewer.kind !== 'node') return denied(res, viewer, 'an adapter upload needs the node token');
      const length = req.headers['content-length'] ? Number(req.headers['content-length']) : null;
      const answer = await artifacts.ingestPeft({ viewer, requestId: crypto.randomUUID() }, id, req, length);
      return reply(res, answer.status, answer.body);
    }
    if (req.method !== 'GET' && req.method !== 'HEAD')
      return reply(res, 405, { error: `${req.method} is not served here` });
    if (viewer.kind === 'anonymous') return denied(res, viewer, 'downloading an artifact needs a session or a token');
    const found = await artifacts.artifact(id, kind ?? '');
    if (!found || (filename && decodeURIComponent(filename) !== found.filename))
      return reply(res, 404, { error: `the job made no ${kind}${filename ? ` named ${filename}` : ''}` });
    res.writeHead(200, {
      'content-type': kind === 'gguf' ? 'application/octet-stream' : 'application/gzip',
      'content-length': String(found.artifact.size),
      'content-disposition': `attachment; filename="${found.filename}"`,
      etag: `"${found.artifact.sha256}"`,
    });
    if (req.method === 'HEAD') {
      res.end();
      return true;
    }
    createReadStream(found.artifact.path)
      .on('error', () => res.destroy())
      .pipe(res);
    return true;
  };
}
