// The thread behind sha256.ts: keeps one running sha256 per stream id and answers each request with its `seq`.
// Blocks arrive as views of SharedArrayBuffers the download is reading into, so nothing is copied on the way.
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const fs = require('node:fs');

const streams = new Map();

function stream(id) {
  const h = streams.get(id);
  if (!h) throw new Error(`no sha256 stream ${id} in the hashing thread (was it restarted?)`);
  return h;
}

/** Feeds a file's bytes to the hash (a partial picked up after a restart); its size, or 0 when there is none. */
function addFile(h, file) {
  let fd;
  try {
    fd = fs.openSync(file, 'r');
  } catch (err) {
    if (err.code === 'ENOENT') return 0;
    throw err;
  }
  try {
    const buf = Buffer.allocUnsafe(1 << 20);
    let size = 0;
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) return size;
      h.update(buf.subarray(0, n));
      size += n;
    }
  } finally {
    fs.closeSync(fd);
  }
}

parentPort.on('message', (m) => {
  try {
    let value;
    if (m.op === 'open') streams.set(m.id, createHash('sha256'));
    else if (m.op === 'update') stream(m.id).update(new Uint8Array(m.buffer, m.offset, m.length));
    else if (m.op === 'file') value = addFile(stream(m.id), m.file);
    else if (m.op === 'digest') value = stream(m.id).copy().digest('hex');
    else if (m.op === 'close') streams.delete(m.id);
    parentPort.postMessage({ seq: m.seq, value });
  } catch (err) {
    parentPort.postMessage({ seq: m.seq, error: err instanceof Error ? err.message : String(err) });
  }
});
