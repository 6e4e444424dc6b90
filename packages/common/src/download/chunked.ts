// The chunked transfer coding (RFC 9112 §7.1) undone in place: a body arrives as `<hex size>[;ext]CRLF <data>
// CRLF … 0 CRLF [trailers] CRLF`, in reads that split it anywhere, and the data is moved down over the framing
// in the same buffer, so a chunked download costs a memmove per chunk and no copy into new buffers. Framing is
// read strictly (CRLF, hex digits): a client that guesses at a malformed body could write the wrong bytes.

type State =
  | 'size'
  | 'extension'
  | 'size-lf'
  | 'data'
  | 'data-cr'
  | 'data-lf'
  | 'trailer-start'
  | 'trailer'
  | 'end-lf'
  | 'done';

const CR = 0x0d;
const LF = 0x0a;

export class ChunkedDecoder {
  private state: State = 'size';
  private size = 0;
  private digits = 0;
  private left = 0;

  /**
   * Decodes buf[from, to) in place: the data in it ends up at buf[from, end). `done` once the last chunk and
   * the trailers have been read; bytes after that are not the body's.
   */
  decode(buf: Buffer, from: number, to: number): { end: number; done: boolean } {
    let out = from;
    let i = from;
    while (i < to) {
      if (this.state === 'data') {
        const n = Math.min(this.left, to - i);
        if (out !== i) buf.copyWithin(out, i, i + n);
        out += n;
        i += n;
        this.left -= n;
        if (this.left === 0) this.state = 'data-cr';
        continue;
      }
      const c = buf[i++] as number;
      switch (this.state) {
        case 'size': {
          const d = hexValue(c);
          if (d >= 0) {
            this.size = this.size * 16 + d;
            if (++this.digits > 13) throw bad('a chunk size over 2^52 bytes');
          } else if (c === CR && this.digits > 0) this.state = 'size-lf';
          else if (c === LF) throw bad('a chunk size line not ended by CRLF');
          else if ((c === 0x3b || c === 0x20 || c === 0x09) && this.digits > 0)
            this.state = 'extension'; // ; SP HT
          else throw bad(`a chunk size that is not hexadecimal (byte 0x${c.toString(16)})`);
          break;
        }
        case 'extension':
          if (c === CR) this.state = 'size-lf';
          break;
        case 'size-lf':
          if (c !== LF) throw bad('a chunk size line not ended by CRLF');
          this.left = this.size;
          this.size = 0;
          this.digits = 0;
          this.state = this.left === 0 ? 'trailer-start' : 'data';
          break;
        case 'data-cr':
          if (c !== CR) throw bad('chunk data longer than its size');
          this.state = 'data-lf';
          break;
        case 'data-lf':
          if (c !== LF) throw bad('chunk data not ended by CRLF');
          this.state = 'size';
          break;
        case 'trailer-start':
          this.state = c === CR ? 'end-lf' : 'trailer';
          break;
        case 'trailer':
          if (c === LF) this.state = 'trailer-start';
          break;
        case 'end-lf':
          if (c !== LF) throw bad('a chunked body not ended by CRLF');
          this.state = 'done';
          return { end: out, done: true };
        case 'done':
          return { end: out, done: true };
      }
    }
    return { end: out, done: this.state === 'done' };
  }
}

function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  return -1;
}

export class MalformedChunks extends Error {}

const bad = (what: string) => new MalformedChunks(`the upstream sent a malformed chunked body: ${what}`);
