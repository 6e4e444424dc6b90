import { knownTensorTypes } from '@hangar/common/gguf/catalog';
import { factsOf } from '@hangar/common/gguf/facts';
import { type GgufHeader, readGguf } from '@hangar/common/gguf/reader';
import { type ByteSource, fileSource } from '@hangar/common/gguf/source';

// Whether a LoRA adapter GGUF fits the model it is published for, read from both headers before anything is saved.
// A job trains on the model's weights as they were; the catalog entry may point at other ones by the time it is
// published (served again from another version, another quantisation of another model). llama.cpp then refuses
// the adapter on every replica, or, worse, a shape that happens to line up loads and answers nonsense.

const dims = (d: readonly number[]) => d.join('×');

/**
 * Why the adapter does not fit the model's file, or null when it does: the architecture, each adapted tensor
 * present in the model with the shape the adapter's halves were made for (the embedding length among them),
 * and the two halves' ranks agreeing.
 */
export function adapterMisfit(adapter: GgufHeader, model: GgufHeader, modelName: string): string | null {
  const a = factsOf(adapter);
  const m = factsOf(model);
  if (a.architecture !== m.architecture)
    return `the adapter is for ${a.architecture ?? 'no named architecture'} and ${modelName}'s file is ${m.architecture ?? 'of no named architecture'}: llama.cpp loads an adapter only on its own architecture. Train it again on ${modelName}'s weights`;
  const base = new Map(model.tensors.map((t) => [t.name, t.dims]));
  const halves = new Map<string, { a?: number[]; b?: number[] }>();
  for (const t of adapter.tensors) {
    const hit = /^(.+)\.lora_([ab])$/.exec(t.name);
    if (!hit) continue;
    const [, target = '', half] = hit;
    const pair = halves.get(target) ?? {};
    pair[half as 'a' | 'b'] = t.dims;
    halves.set(target, pair);
  }
  if (!halves.size)
    return 'the adapter holds no LoRA tensors (*.lora_a, *.lora_b): it is not a LoRA adapter llama.cpp loads';
  const embd = m.embeddingLength ? ` (its embedding length is ${m.embeddingLength})` : '';
  for (const [target, pair] of halves) {
    if (!pair.a || !pair.b) return `the adapter has only one half of ${target}: it is incomplete`;
    const shape = base.get(target);
    if (!shape)
      return `the adapter changes ${target}, which ${modelName}'s file has no tensor of: it was made for a model of another shape`;
    const [inner = 0, outer = 0] = shape;
    // GGUF gives dimensions innermost first: a linear layer's A is [in, rank] and B [rank, out] against the
    // weight's [in, out]; the token embedding's A is picked by token, [rank, vocab], and its B is [rank, embd].
    const embedding = target === 'token_embd.weight';
    const rankA = embedding ? pair.a[0] : pair.a[1];
    const rankB = pair.b[0];
    if (rankA !== rankB)
      return `${target}: the adapter's halves have ranks ${rankA} and ${rankB}: they do not fit together`;
    const wantIn = embedding ? pair.a[1] : pair.a[0];
    const wantOut = pair.b[1];
    const hasIn = embedding ? outer : inner;
    const hasOut = embedding ? inner : outer;
    if (wantIn !== hasIn || wantOut !== hasOut)
      return `${target}: the adapter was made for ${embedding ? dims([wantOut ?? 0, wantIn ?? 0]) : dims([wantIn ?? 0, wantOut ?? 0])} and ${modelName}'s file has ${dims(shape)}${embd}: it was trained on a model of other dimensions`;
    if (rankA === undefined || rankA < 1 || rankA > Math.min(hasIn, hasOut))
      return `${target}: rank ${rankA} does not fit a ${dims(shape)} tensor`;
  }
  return null;
}

/** Both headers from disk, and the verdict; a file that cannot be read is said so (the publish is refused). */
export function checkAdapterFile(adapterPath: string, modelPath: string, modelName: string): Promise<string | null> {
  const open = (file: string, what: string) => async () => {
    const src = await fileSource(file).catch(() => null);
    if (!src) throw new Error(`${what} is not on disk (${file})`);
    return src;
  };
  return checkAdapterBytes(open(adapterPath, 'the adapter'), open(modelPath, `${modelName}'s file`), modelName);
}

/**
 * The same from wherever the bytes are: the model's header read by Range from a bucket (HANGAR_MIRROR_STORE=s3://…)
 * needs megabytes, not the model's gigabytes.
 */
export async function checkAdapterBytes(
  adapter: () => Promise<ByteSource>,
  model: () => Promise<ByteSource>,
  modelName: string,
): Promise<string | null> {
  const read = async (open: () => Promise<ByteSource>, what: string) => {
    const src = await open().catch((err: Error) => {
      throw new Error(`${what} could not be opened: ${err.message}`);
    });
    try {
      return await readGguf(src, knownTensorTypes);
    } catch (err) {
      throw new Error(`${what} could not be read as a GGUF: ${(err as Error).message}`);
    } finally {
      await src.close();
    }
  };
  try {
    const [a, m] = await Promise.all([read(adapter, 'the adapter'), read(model, `${modelName}'s file`)]);
    return adapterMisfit(a, m, modelName);
  } catch (err) {
    return (err as Error).message;
  }
}

/**
 * The same question for a PEFT adapter and the vLLM model it is published for, from the model's config.json (its
 * hidden_size) and the adapter's own tensors: each LoRA A of an attention or MLP input takes the hidden size, and
 * each pair's ranks agree. Null when it fits, or when the model's config does not say its hidden size.
 */
export function peftMisfit(
  tensors: readonly { name: string; shape: readonly number[] }[],
  modelConfig: Record<string, unknown>,
  modelName: string,
): string | null {
  const hidden = typeof modelConfig.hidden_size === 'number' ? modelConfig.hidden_size : null;
  const halves = new Map<string, { a?: readonly number[]; b?: readonly number[] }>();
  for (const t of tensors) {
    const hit = /^(.+)\.lora_([AB])\.weight$/.exec(t.name);
    if (!hit) continue;
    const [, target = '', half] = hit;
    const pair = halves.get(target) ?? {};
    pair[half === 'A' ? 'a' : 'b'] = t.shape;
    halves.set(target, pair);
  }
  for (const [target, { a, b }] of halves) {
    if (!a || !b) return `the adapter has only one half of ${target}: it is incomplete`;
    // torch's shapes, outermost first: A [rank, in], B [out, rank].
    if (a[0] !== b[1])
      return `${target}: the adapter's halves have ranks ${a[0]} and ${b[1]}: they do not fit together`;
    const takesHidden = /(q_proj|k_proj|v_proj|gate_proj|up_proj)$/.test(target);
    if (hidden !== null && takesHidden && a[1] !== hidden)
      return `${target}: the adapter was made for a hidden size of ${a[1]} and ${modelName}'s config.json says ${hidden}: it was trained on a model of other dimensions`;
  }
  return null;
}
