import { createReadStream } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AuditService } from '../audit/audit.service.js';
import type { AuthService } from '../auth/auth.service.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { TrainArtifacts } from './artifacts.js';
import { TRAIN_MAX_DATA_BYTES, utf8Fault } from './data.js';
import type { TrainService } from './train.service.js';

// The training routes that carry files rather than GraphQL: the pairs (up to 64 MiB, over the GraphQL body
// limit), the job's data for its node, the adapter the node uploads, and the artifacts operators download.
//
//   POST /api/train/data                               operator: NDJSON pairs → the check report (+ sha256)
//   GET  /api/train/jobs/<id>/data                     the job's node, or an operator its owner admits
//   PUT  /api/train/jobs/<id>/artifacts/peft           the job's node: the adapter as a gzipped tar
//   GET  /api/train/jobs/<id>/artifacts/<kind>[/name]  peft or gguf: any signed-in caller for a public job; for
//                                                      an owned one, those its owner admits and the job's node
//
// Uploaded pairs are kept by their sha256 and change nothing an operator sees until createTrainJob (audited) uses
// them; a refused upload is audited, so an operator can see who tried to send what.
type Deps = { train: TrainService; artifacts: TrainArtifacts; auth: AuthService; audit: AuditService };

const JOB = /^\/api\/train\/jobs\/([0-9a-f-]{36})\/(data|artifacts\/(peft|gguf)(?:\/([^/]+))?)$/;

export function trainRoutes({ train, artifacts, auth, audit }: Deps) {
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
  /**
   * Audits a refused upload, then answers it. Anonymous callers are not audited: anyone could add rows without
   * end (the reason login refusals are coalesced); everyone who showed a credential is.
   */
  const refuseUpload = async (
    res: ServerResponse,
    viewer: Viewer,
    action: string,
    target: string | undefined,
    status: number,
    body: Record<string, unknown>,
  ): Promise<true> => {
    if (viewer.kind !== 'anonymous')
      await audit.refused({ viewer, requestId: crypto.randomUUID() }, action, target, String(body.error ?? status));
    return reply(res, status, body);
  };

  /** Whether this router serves the path; then it answers. */
  return async (req: IncomingMessage, res: ServerResponse, path: string): Promise<boolean> => {
    if (path === '/api/train/data') {
      if (req.method !== 'POST') return reply(res, 405, { error: 'POST the pairs as NDJSON' });
      const viewer = await who(req);
      const refuse = (status: number, error: string) =>
        refuseUpload(res, viewer, 'uploadTrainData', undefined, status, { error });
      if (!operator(viewer)) {
        if (viewer.kind === 'anonymous') return denied(res, viewer, 'uploading training data needs the OPERATOR role');
        return refuse(403, 'uploading training data needs the OPERATOR role');
      }
      const length = Number(req.headers['content-length'] ?? Number.NaN);
      if (!Number.isSafeInteger(length)) return refuse(411, 'an upload needs a Content-Length header');
      if (length > TRAIN_MAX_DATA_BYTES)
        return refuse(413, `the data is ${length} bytes; at most ${TRAIN_MAX_DATA_BYTES} (64 MiB)`);
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const c of req as AsyncIterable<Buffer>) {
        size += c.length;
        if (size > TRAIN_MAX_DATA_BYTES) return refuse(413, `the data is over ${TRAIN_MAX_DATA_BYTES} bytes (64 MiB)`);
        chunks.push(c);
      }
      const bytes = Buffer.concat(chunks);
      // Decoding would replace bad bytes with U+FFFD: the pairs trained on and the sha256 answered would not be
      // the file's. Refused instead, at the place to look.
      const fault = utf8Fault(bytes);
      if (fault)
        return refuse(
          422,
          `line ${fault.line}, byte ${fault.byte} (offset ${fault.offset} in the file) is not UTF-8: the pairs are ` +
            'NDJSON in UTF-8; convert the file (iconv -f <its encoding> -t UTF-8) and upload it again',
        );
      // ?model=<catalog model>&max_len=<n>: token counts by that model's tokenizer too.
      const query = new URL(req.url ?? '/', 'http://hangar').searchParams;
      const maxLen = Number(query.get('max_len'));
      // ignoreBOM: a byte-order mark stays in the text, so the sha256 answered is the file's own.
      const text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
      const report = await train.storeData(text, {
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
      if (!job) return reply(res, 404, { error: `no training job ${id}` });
      // The pairs may be a knowledge base's: only the node that trains on them, or an operator the owner admits.
      if (!(await train.mayReadData(viewer, job)))
        return denied(
          res,
          viewer,
          job.owner
            ? "the data is for the job's node, and for operators its owner admits (a member of it) and admins"
            : "the data is for the job's node and operators",
        );
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
      if (viewer.kind === 'anonymous') return denied(res, viewer, 'an adapter upload needs the node token');
      if (viewer.kind !== 'node')
        return refuseUpload(res, viewer, 'uploadTrainArtifact', `job ${id}`, 403, {
          error: "an adapter upload needs the job's node token",
        });
      const length = req.headers['content-length'] ? Number(req.headers['content-length']) : null;
      const answer = await artifacts.ingestPeft({ viewer, requestId: crypto.randomUUID() }, id, req, length);
      if (answer.status >= 400)
        return refuseUpload(res, viewer, 'uploadTrainArtifact', `job ${id}`, answer.status, answer.body);
      return reply(res, answer.status, answer.body);
    }
    if (req.method !== 'GET' && req.method !== 'HEAD')
      return reply(res, 405, { error: `${req.method} is not served here` });
    if (viewer.kind === 'anonymous') return denied(res, viewer, 'downloading an artifact needs a session or a token');
    const found = await artifacts.artifact(id, kind ?? '');
    const shownName = filename ? ` named ${JSON.stringify(safeDecode(filename))}` : '';
    if (!found || (filename && safeDecode(filename) !== found.filename))
      return reply(res, 404, { error: `the job made no ${kind}${shownName}` });
    // The job is listed to every viewer; what it made is its owner's, as the pairs it was trained on are.
    if (!(await train.mayReadArtifacts(viewer, found.job)))
      return denied(
        res,
        viewer,
        "what this job made is its owner's: those the owner admits (a member of it), admins and the job's node may download it",
      );
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

/** A path segment decoded, or null when it is not valid percent-encoding (which then matches no file). */
function safeDecode(segment: string): string | null {
  try {
    return decodeURIComponent(segment);
  } catch {
    return null;
  }
}
