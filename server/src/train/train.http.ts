import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AuditService } from '../audit/audit.service.js';
import type { Viewer } from '../auth/viewer.js';
import { sendJson, statusOf } from '../http/reply.js';
import { type Edge, needRole, type Route } from '../http/routes.js';
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
// them; a refused upload is audited, so an operator can see who tried to send what. The caller and the request id
// come from the HTTP edge (http/routes.ts); who may do what depends on the job asked for, so it is decided here.
type Deps = { train: TrainService; artifacts: TrainArtifacts; audit: AuditService };

const JOB = /^\/api\/train\/jobs\/([0-9a-f-]{36})\/(data|artifacts\/(peft|gguf)(?:\/([^/]+))?)$/;

export function trainRoutes({ train, artifacts, audit }: Deps) {
  /** Answers with JSON; true, because every answer here means "this router served the path". */
  const reply = (res: ServerResponse, status: number, body: unknown): true => {
    sendJson(res, status, body);
    return true;
  };
  const denied = (res: ServerResponse, viewer: Viewer, need: string): true =>
    reply(res, viewer.kind === 'anonymous' ? 401 : 403, {
      error: viewer.kind === 'anonymous' ? (viewer.reason ?? `sign in or send a token: ${need}`) : need,
    });
  /**
   * Audits a refused upload, then answers it. Anonymous callers are not audited: anyone could add rows without
   * end (the reason login refusals are coalesced); everyone who showed a credential is.
   */
  const refuseUpload = async (
    res: ServerResponse,
    edge: Edge,
    viewer: Viewer,
    action: string,
    target: string | undefined,
    status: number,
    body: Record<string, unknown>,
  ): Promise<true> => {
    if (viewer.kind !== 'anonymous')
      await audit.refused(await edge.actor(), action, target, String(body.error ?? status));
    return reply(res, status, body);
  };

  /** Whether this router serves the path; then it answers. */
  return async (req: IncomingMessage, res: ServerResponse, edge: Edge): Promise<boolean> => {
    const path = edge.path;
    // A POST is the edge's "train data" route (trainDataRoute): any other method is answered here.
    if (path === '/api/train/data') return reply(res, 405, { error: 'POST the pairs as NDJSON' });

    const m = JOB.exec(path);
    if (!m) return false;
    const [, id = '', what = '', kind, filename] = m;
    const viewer = await edge.viewer();

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
      // From the data dir, or the mirror's bucket (train-files.ts): any replica serves any job's pairs. Opened
      // before the status is sent, so a blob missing from the bucket is said as such rather than a cut connection.
      const body = req.method === 'HEAD' ? null : await train.files.dataStream(job).catch((err: Error) => err);
      if (body instanceof Error)
        return reply(res, 500, { error: missing(`the job's pairs (sha256 ${job.dataSha256})`, body) });
      res.writeHead(200, {
        'content-type': 'application/x-ndjson',
        'content-length': String(job.dataBytes),
        etag: `"${job.dataSha256}"`,
      });
      if (!body) {
        res.end();
        return true;
      }
      body.on('error', () => res.destroy()).pipe(res);
      return true;
    }

    if (req.method === 'PUT' && kind === 'peft' && !filename) {
      if (viewer.kind === 'anonymous') return denied(res, viewer, 'an adapter upload needs the node token');
      if (viewer.kind !== 'node')
        return refuseUpload(res, edge, viewer, 'uploadTrainArtifact', `job ${id}`, 403, {
          error: "an adapter upload needs the job's node token",
        });
      const length = req.headers['content-length'] ? Number(req.headers['content-length']) : null;
      // One actor for the upload and for its refusal: both rows, and the log, carry the edge's request id.
      const uploaded = await artifacts.ingestPeft(await edge.actor(), id, req, length);
      if (!uploaded.ok)
        return refuseUpload(res, edge, viewer, 'uploadTrainArtifact', `job ${id}`, statusOf(uploaded.error), {
          error: uploaded.error.message,
        });
      return reply(res, 200, uploaded.value);
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
    const body =
      req.method === 'HEAD' ? null : await train.files.artifactStream(found.artifact).catch((err: Error) => err);
    if (body instanceof Error)
      return reply(res, 500, { error: missing(`${found.filename} (sha256 ${found.artifact.sha256})`, body) });
    res.writeHead(200, {
      'content-type': kind === 'gguf' ? 'application/octet-stream' : 'application/gzip',
      'content-length': String(found.artifact.size),
      'content-disposition': `attachment; filename="${found.filename}"`,
      etag: `"${found.artifact.sha256}"`,
    });
    if (!body) {
      res.end();
      return true;
    }
    body.on('error', () => res.destroy()).pipe(res);
    return true;
  };
}

/** Why a kept file could not be opened, and what to do. */
function missing(what: string, err: Error): string {
  return `${what} could not be read: ${err.message}. On a bucket (HANGAR_MIRROR_STORE=s3://…) it was removed from the bucket, or this server is pointed at another one; the job's files are kept only while the job is`;
}

/** A path segment decoded, or null when it is not valid percent-encoding (which then matches no file). */
function safeDecode(segment: string): string | null {
  try {
    return decodeURIComponent(segment);
  } catch {
    return null;
  }
}

/**
 * POST /api/train/data, a route of the HTTP edge: the OPERATOR rule is declared here and checked (and a refusal
 * of a caller with a credential audited) by the edge; the checks that need the bytes are made as they arrive.
 */
export function trainDataRoute({ train, audit }: Pick<Deps, 'train' | 'audit'>): Route {
  const need = 'uploading training data needs the OPERATOR role';
  return {
    name: 'train data',
    match: (path, method) => method === 'POST' && path === '/api/train/data',
    authorize: needRole('OPERATOR', {
      anonymous: `sign in or send a token: ${need}`,
      notAUser: need,
      tooLow: () => need,
    }),
    auditRefusal: { action: 'uploadTrainData', target: () => undefined },
    handle: async (req, res, edge) => {
      // Every refusal past the role check is of a caller with a credential, and is audited.
      const refuse = async (status: number, error: string) => {
        await audit.refused(await edge.actor(), 'uploadTrainData', undefined, error);
        sendJson(res, status, { error });
      };
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
        viewer: (await edge.actor()).viewer,
        maxLen: Number.isInteger(maxLen) && maxLen >= 16 && maxLen <= 32768 ? maxLen : null,
      });
      sendJson(res, 200, { ...report, ok: report.errorCount === 0 && report.pairs > 0 });
    },
  };
}
