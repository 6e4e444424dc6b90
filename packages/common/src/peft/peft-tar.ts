import { createHash } from 'node:crypto';
import { pipeline } from 'node:stream/promises';
import zlib from 'node:zlib';
import tar from 'tar-stream';

// The PEFT adapter a node uploads: a gzipped tar of the trainer's output directory. It comes from a machine Hangar
// does not control, so it is read as hostile and never unpacked to disk: each entry is checked against a short list
// of names before a byte of it is read, the whole stream is aborted at the first broken rule (the rest of a bomb is
// never inflated), and only the two files Hangar uses (adapter_config.json and the safetensors) are kept in memory.
// The node's side, packing its output directory, is peft-pack.ts (re-exported here, where importers find it).

export { packDirectory } from './peft-pack.js';

/** A refused upload: the message is for the operator, names the entry and says what is accepted. */
export class PeftTarError extends Error {
  override name = 'PeftTarError';
  constructor(
    message: string,
    /** The tar entry at fault, as named in the tar; null when the fault is the stream itself. */
    readonly entry: string | null = null,
  ) {
    super(message);
  }
}

export type PeftTarLimits = {
  /** Entries of any kind, the "./" root included. The list of names below is shorter, so this bites only first. */
  maxEntries: number;
  /** adapter_model.safetensors, held in memory whole: callers set this to what they can afford to hold. */
  maxWeightBytes: number;
  /** adapter_config.json and the other JSON and text files: a config is a few hundred bytes. */
  maxTextBytes: number;
  /** tokenizer.json and its kin: a Llama 3 tokenizer.json is 9 MiB. Hashed and dropped, so no memory is held. */
  maxTokenizerBytes: number;
  /** All entries' sizes added up; at least maxWeightBytes plus room for the rest. */
  maxTotalBytes: number;
  /**
   * Inflated bytes over compressed bytes. Adapter weights compress to about 1× (f32 1.1×, bf16 1.3×, 2.6× for an
   * untrained one whose B matrices are zeros), so far past that is a gzip bomb. This is what bounds memory for
   * what arrives: the weights are held whole, so at 200× a 16 MB upload could fill a 2 GiB buffer before any
   * other rule stopped it; at 16× it is refused after holding at most 16 bytes per byte uploaded.
   */
  maxRatio: number;
  /** The ratio is judged only past this many inflated bytes, where a small tar of JSON could compress well. */
  ratioAfterBytes: number;
  /**
   * Tar bytes that are not file data: headers, padding and pax records. tar-stream holds a pax record whole in
   * memory before the entry it describes appears, so a huge one would be held without this.
   */
  maxOverheadBytes: number;
};

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

export const DEFAULT_PEFT_TAR_LIMITS: PeftTarLimits = {
  maxEntries: 32,
  maxWeightBytes: 2 * GiB,
  maxTextBytes: MiB,
  maxTokenizerBytes: 32 * MiB,
  maxTotalBytes: 4 * GiB,
  maxRatio: 16,
  ratioAfterBytes: MiB,
  maxOverheadBytes: 4 * MiB,
};

export type PeftTarFile = { name: string; size: number; sha256: string };

export type PeftTarContents = {
  /** Every regular file, in tar order, named without a leading "./". */
  files: PeftTarFile[];
  /** adapter_config.json, parsed. */
  config: Record<string, unknown>;
  /** adapter_model.safetensors, whole. */
  weights: Buffer;
  /** The upload's size and sha256, as read. */
  compressedBytes: number;
  sha256: string;
};

type Kind = 'config' | 'weights' | 'text' | 'tokenizer';

/**
 * What a PEFT output directory holds: the adapter (config + weights), the model card PEFT writes (README.md), the
 * tokenizer files a trainer may save beside it, and a trainer's JSON logs. Nothing here is executed or loaded
 * by Hangar except the config (parsed as JSON) and the safetensors (read by offsets).
 */
const ACCEPTED = new Map<string, Kind>([
  ['adapter_config.json', 'config'],
  ['adapter_model.safetensors', 'weights'],
  ['README.md', 'text'],
  ['training_args.json', 'text'],
  ['trainer_state.json', 'text'],
  ['special_tokens_map.json', 'text'],
  ['added_tokens.json', 'text'],
  ['chat_template.jinja', 'text'],
  ['tokenizer.json', 'tokenizer'],
  ['tokenizer_config.json', 'tokenizer'],
  ['tokenizer.model', 'tokenizer'],
  ['vocab.json', 'tokenizer'],
  ['merges.txt', 'tokenizer'],
]);

const ACCEPTED_LIST = [...ACCEPTED.keys()].join(', ');

/** torch.save's formats are pickles, and unpickling runs whatever code the file names: none is ever accepted. */
const PICKLE = /\.(bin|pt|pth|pkl|pickle|ckpt)$/i;

/** A name as an operator can read it in a message: escaped, and cut short if a hostile tar made it huge. */
function shown(name: string): string {
  const s = JSON.stringify(name);
  return s.length > 120 ? `${s.slice(0, 117)}…"` : s;
}

function pickleRefusal(name: string): string {
  const hint =
    name === 'adapter_model.bin'
      ? 'save the adapter with save_pretrained(out_dir, safe_serialization=True) so it is adapter_model.safetensors'
      : name === 'training_args.bin'
        ? "leave the Trainer's training_args.bin out (TrainingArguments.to_json_string() can go in training_args.json)"
        : 'leave it out of the adapter directory';
  return `${shown(name)} is a pickle (torch.save format), and loading a pickle runs code: ${hint}`;
}

/** Why a tar name is refused as a path, or null when it is a plain file name. */
function pathRefusal(name: string): string | null {
  if (name.startsWith('/') || name.startsWith('\\') || /^[A-Za-z]:/.test(name)) return 'an absolute path';
  const parts = name.split(/[/\\]/);
  if (parts.includes('..')) return 'a path that climbs out of the directory ("..")';
  if (parts.length > 1) return 'a path into a subdirectory';
  if (name === '' || name === '.') return 'an empty name';
  return null;
}

const TYPE_WORDS: Record<string, string> = {
  link: 'a hard link',
  symlink: 'a symlink',
  'character-device': 'a character device',
  'block-device': 'a block device',
  fifo: 'a FIFO',
  directory: 'a directory',
  'contiguous-file': 'a contiguous file (type 7)',
};

function resolveLimits(given: Partial<PeftTarLimits>): PeftTarLimits {
  const limits = { ...DEFAULT_PEFT_TAR_LIMITS, ...given };
  // A caller that raises the weights cap (a rank-256 LoRA of a 70B model is ~3 GiB) should not then be refused
  // by the total cap it did not think to raise.
  if (given.maxTotalBytes === undefined)
    limits.maxTotalBytes = Math.max(limits.maxTotalBytes, limits.maxWeightBytes + 64 * MiB);
  return limits;
}

/** The upload's stream errors, said for the operator. zlib's own words are kept in brackets. */
function streamRefusal(err: unknown): PeftTarError | null {
  if (err instanceof PeftTarError) return err;
  const e = err as NodeJS.ErrnoException;
  if (typeof e?.code === 'string' && e.code.startsWith('Z_')) {
    if (e.code === 'Z_BUF_ERROR')
      return new PeftTarError(`the gzip stream ends early (${e.message}): the upload was cut short; send it again`);
    return new PeftTarError(
      `the upload is not a valid gzip stream (${e.message}): send the output directory as a .tar.gz`,
    );
  }
  return null;
}

function tarRefusal(err: Error): PeftTarError {
  if (err instanceof PeftTarError) return err;
  if (/unexpected end of data/i.test(err.message))
    return new PeftTarError('the tar ends inside an entry: the archive was cut short before it was gzipped');
  if (/invalid tar header/i.test(err.message))
    return new PeftTarError(`the tar is corrupt or not a tar (${err.message.replace(/\s*Maybe.*$/, '')})`);
  return new PeftTarError(`the tar could not be read: ${err.message}`);
}

/**
 * Reads and checks a PEFT adapter tarball (.tar.gz) as it streams, without touching the disk. Resolves with the
 * file list, the parsed config and the safetensors bytes; rejects with PeftTarError when the upload breaks a rule
 * (and stops reading it there), or with the source's own error when the source fails.
 */
export async function readPeftTar(
  source: AsyncIterable<Buffer> | NodeJS.ReadableStream,
  limits: Partial<PeftTarLimits> = {},
): Promise<PeftTarContents> {
  const lim = resolveLimits(limits);
  const uploadHash = createHash('sha256');
  let compressedBytes = 0;
  let inflatedBytes = 0;
  let fileDataBytes = 0;
  let declaredBytes = 0;
  let entryCount = 0;
  const files: PeftTarFile[] = [];
  const seen = new Set<string>();
  // Set from the extract's callbacks; a holder, so the checks after the pipeline see what the callbacks set.
  const got: { failure: PeftTarError | null; config: Record<string, unknown> | null; weights: Buffer | null } = {
    failure: null,
    config: null,
    weights: null,
  };

  const extract = tar.extract();
  const refuse = (err: PeftTarError) => {
    got.failure ??= err;
    extract.destroy(err);
  };
  extract.on('error', (err: Error) => {
    got.failure ??= tarRefusal(err);
  });

  /** The accepted name and kind, null for a harmless root entry; throws PeftTarError for anything else. */
  const admit = (header: tar.Headers): { name: string; kind: Kind; size: number } | null => {
    entryCount += 1;
    const raw = header.name;
    if (entryCount > lim.maxEntries)
      throw new PeftTarError(
        `the tar has more than ${lim.maxEntries} entries (at ${shown(raw)}); an adapter directory holds a handful of files`,
        raw,
      );
    // `tar -czf adapter.tgz -C out .` starts with "./": unpacked, it makes nothing that is not already there,
    // so it is let through. Any other directory would be a place for files Hangar does not list.
    if (header.type === 'directory' && (raw === './' || raw === '.')) return null;
    if (header.type !== 'file') {
      const what = TYPE_WORDS[header.type ?? ''] ?? `an entry of unknown type (${String(header.type)})`;
      const target = header.linkname ? ` to ${shown(header.linkname)}` : '';
      throw new PeftTarError(
        `${shown(raw)} is ${what}${target}: the adapter tar holds regular files only, at its top level`,
        raw,
      );
    }
    const name = raw.startsWith('./') ? raw.slice(2) : raw;
    const asPath = pathRefusal(name);
    if (asPath)
      throw new PeftTarError(
        `${shown(raw)} is ${asPath}: the adapter tar holds plain file names at its top level (a leading "./" is fine)`,
        raw,
      );
    if (PICKLE.test(name)) throw new PeftTarError(pickleRefusal(name), raw);
    const kind = ACCEPTED.get(name);
    if (!kind) throw new PeftTarError(`${shown(raw)} is not a file of a PEFT adapter; accepted: ${ACCEPTED_LIST}`, raw);
    if (seen.has(name)) throw new PeftTarError(`${shown(name)} appears twice in the tar: each file once`, raw);
    seen.add(name);

    const size = header.size ?? 0;
    if (!Number.isSafeInteger(size) || size < 0)
      throw new PeftTarError(`${shown(name)} has a size the tar cannot mean (${String(header.size)})`, raw);
    const cap =
      kind === 'weights' ? lim.maxWeightBytes : kind === 'tokenizer' ? lim.maxTokenizerBytes : lim.maxTextBytes;
    if (size > cap) throw new PeftTarError(`${shown(name)} is ${size} bytes; at most ${cap} are accepted`, raw);
    if (kind === 'weights' && size === 0) throw new PeftTarError(`${shown(name)} is empty`, raw);
    declaredBytes += size;
    if (declaredBytes > lim.maxTotalBytes)
      throw new PeftTarError(
        `the files add up to more than ${lim.maxTotalBytes} bytes (at ${shown(name)}); an adapter is its weights and a few small files`,
        raw,
      );
    return { name, kind, size };
  };

  extract.on('entry', (header, stream, next) => {
    // The reason for any failure is recorded once, on the extract; the entry's own error says nothing new.
    stream.on('error', () => {});
    let entry: { name: string; kind: Kind; size: number } | null;
    try {
      entry = admit(header);
    } catch (err) {
      refuse(err as PeftTarError);
      return;
    }
    if (!entry) {
      stream.resume();
      next();
      return;
    }
    const { name, kind, size } = entry;
    const hash = createHash('sha256');
    // The safetensors gets its final buffer now, at its (already capped) declared size: the pages are only
    // committed as bytes arrive, so a bomb that is stopped early costs what it delivered, and a real adapter is
    // never held twice, as gathering chunks and concatenating them at the end would.
    let held: Buffer | null = null;
    if (kind === 'weights') {
      try {
        held = Buffer.allocUnsafeSlow(size);
      } catch {
        refuse(new PeftTarError(`${shown(name)} is ${size} bytes, more than this server can set aside now`, name));
        return;
      }
    }
    const configChunks: Buffer[] | null = kind === 'config' ? [] : null;
    let received = 0;
    stream.on('data', (chunk: Buffer) => {
      if (received + chunk.length > size) {
        refuse(new PeftTarError(`${shown(name)} holds more bytes than its header says`, name));
        return;
      }
      hash.update(chunk);
      if (held) chunk.copy(held, received);
      else configChunks?.push(chunk);
      received += chunk.length;
      fileDataBytes += chunk.length;
    });
    stream.on('end', () => {
      if (got.failure) return;
      if (received !== size) {
        refuse(new PeftTarError(`${shown(name)} ends after ${received} of its ${size} bytes`, name));
        return;
      }
      files.push({ name, size, sha256: hash.digest('hex') });
      if (held) got.weights = held;
      if (configChunks) {
        let parsed: unknown;
        try {
          parsed = JSON.parse(Buffer.concat(configChunks).toString('utf8'));
        } catch (err) {
          refuse(new PeftTarError(`adapter_config.json is not JSON: ${(err as Error).message}`, name));
          return;
        }
        if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
          refuse(new PeftTarError('adapter_config.json is not a JSON object (PEFT writes one object)', name));
          return;
        }
        got.config = parsed as Record<string, unknown>;
      }
      next();
    });
  });

  /** Resolves when the extract wants more, rejects when it has stopped (a refusal or a corrupt tar). */
  const drained = () =>
    new Promise<void>((resolve, reject) => {
      const done = (err?: Error) => {
        extract.off('drain', onDrain);
        extract.off('close', onClose);
        if (err) reject(err);
        else resolve();
      };
      const onDrain = () => done();
      const onClose = () => done(got.failure ?? new PeftTarError('the tar reader stopped'));
      extract.on('drain', onDrain);
      extract.on('close', onClose);
    });

  const finished = () =>
    new Promise<void>((resolve, reject) => {
      extract.on('finish', () => resolve());
      extract.on('close', () => (got.failure ? reject(got.failure) : resolve()));
    });

  async function* counted(chunks: AsyncIterable<Buffer | string>) {
    for await (const chunk of chunks) {
      const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      compressedBytes += buf.length;
      uploadHash.update(buf);
      yield buf;
    }
  }

  const feed = async (inflated: AsyncIterable<Buffer>) => {
    const ended = finished();
    ended.catch(() => {});
    for await (const chunk of inflated) {
      if (got.failure) throw got.failure;
      inflatedBytes += chunk.length;
      if (inflatedBytes > lim.ratioAfterBytes && inflatedBytes > lim.maxRatio * compressedBytes) {
        const ratio = Math.floor(inflatedBytes / compressedBytes);
        throw new PeftTarError(
          `the upload inflates ${ratio}× (${inflatedBytes} bytes from the first ${compressedBytes}); adapter weights ` +
            `compress to about 1×, and past ${lim.ratioAfterBytes} bytes more than ${lim.maxRatio}× (the limit) is ` +
            'refused as a gzip bomb: upload the trainer output as it is, not padded',
        );
      }
      if (inflatedBytes - fileDataBytes > lim.maxOverheadBytes)
        throw new PeftTarError(
          `the tar holds over ${lim.maxOverheadBytes} bytes that are not file data (headers, pax records, padding); ` +
            'a tar of a few files has a few KiB',
        );
      const more = extract.write(chunk);
      if (got.failure) throw got.failure;
      if (!more) await drained();
    }
    extract.end();
    await ended;
  };

  try {
    await pipeline(source, counted, zlib.createGunzip(), feed);
  } catch (err) {
    if (!extract.destroyed) extract.destroy();
    // A refusal made inside the extract surfaces in the pipeline as whatever stopped first; report the refusal.
    throw got.failure ?? streamRefusal(err) ?? err;
  }
  if (got.failure) throw got.failure;

  const { config, weights } = got;
  if (!config) throw new PeftTarError(`the tar has no adapter_config.json; a PEFT adapter is ${REQUIRED}`);
  if (!weights) throw new PeftTarError(`the tar has no adapter_model.safetensors; a PEFT adapter is ${REQUIRED}`);
  return { files, config, weights, compressedBytes, sha256: uploadHash.digest('hex') };
}

const REQUIRED = 'adapter_config.json and adapter_model.safetensors (what PEFT save_pretrained writes)';
