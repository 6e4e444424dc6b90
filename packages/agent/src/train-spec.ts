import { z } from 'zod';

// The spec a training claim answers (docs/training.md), checked before the agent acts on it: the control plane
// may be older or newer than this agent, and a path in it must not write outside the job's directory.

const SHA256 = /^[0-9a-f]{64}$/;

/** A path inside the base directory: relative, no "..", no backslashes, so a spec cannot write outside it. */
const relativePath = z
  .string()
  .min(1)
  .max(500)
  .refine(
    (p) => !p.startsWith('/') && !p.includes('\\') && p.split('/').every((s) => s !== '' && s !== '.' && s !== '..'),
    'a relative path inside the repository, without ".." or "\\"',
  );

const number = z.number().refine(Number.isFinite, 'a finite number');

// Loose objects: keys this agent does not know are passed on to the trainer in job.json, so a newer control plane
// and trainer can add a setting without waiting for every agent to learn it.
const trainSpec = z.looseObject({
  id: z.string().min(1),
  name: z.string(),
  base_repo: z.string().min(1),
  base_revision: z.string().min(1).nullable(),
  params: z.looseObject({
    rank: number,
    alpha: number,
    dropout: number,
    epochs: number,
    lr: number,
    batch: number,
    max_len: number,
    seed: number,
  }),
  data: z.object({
    url: z.string().min(1),
    sha256: z.string().regex(SHA256, 'a sha256 in hex'),
    bytes: z.number().int().min(0),
    pairs: z.number().int().min(0),
  }),
  base: z.object({
    files: z
      .array(
        z.object({
          path: relativePath,
          url: z.string().min(1),
          size: z.number().int().min(0).nullish(),
          sha256: z.string().regex(SHA256, 'a sha256 in hex').nullish(),
        }),
      )
      .min(1, 'at least one file (config.json and the weights)'),
  }),
  gguf: z.boolean(),
  // What the node evaluates the adapter with after training (docs/training.md); absent from older control planes.
  eval: z
    .object({
      seed: z.number().int(),
      held_out_lines: z.array(z.number().int().min(1)),
      pairs: z.array(z.object({ q: z.string(), a: z.string() })),
      general: z.array(z.object({ q: z.string(), a: z.string() })),
      model: z.object({ url: z.string().min(1), size: z.number().int().min(0) }).nullable(),
      model_note: z.string().nullable(),
      max_tokens: z.number().int().min(1).max(4096),
      min_questions: z.number().int().min(0),
      // Which engine evaluates: llama.cpp with the GGUF adapter, or vLLM with the PEFT one. Absent from older
      // control planes, which asked for llama.cpp only.
      engine: z.enum(['llamacpp', 'vllm']).optional(),
    })
    .optional(),
});

export type TrainSpec = z.infer<typeof trainSpec>;

/** The claim succeeded (the job is this node's now) but its spec cannot be read: the job is failed with this. */
export class TrainSpecError extends Error {
  override name = 'TrainSpecError';
}

/** Reads a claim's spec; relative URLs (data, mirror files) are resolved against the control plane's URL. */
export function parseTrainSpec(value: unknown, baseUrl: string): TrainSpec {
  let raw = value;
  if (typeof raw === 'string') {
    try {
      raw = JSON.parse(raw);
    } catch {
      throw new TrainSpecError('the claim answered a spec that is not JSON');
    }
  }
  const parsed = trainSpec.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new TrainSpecError(
      `the claim's spec is not in the shape this agent reads (docs/training.md): ${issue?.path.join('.') || 'spec'}: ${issue?.message}`,
    );
  }
  const spec = parsed.data;
  const resolve = (u: string) => {
    try {
      return new URL(u, `${baseUrl}/`).toString();
    } catch {
      throw new TrainSpecError(`the claim's spec has a URL this agent cannot read: ${u}`);
    }
  };
  return {
    ...spec,
    data: { ...spec.data, url: resolve(spec.data.url) },
    base: { ...spec.base, files: spec.base.files.map((f) => ({ ...f, url: resolve(f.url) })) },
    ...(spec.eval
      ? { eval: { ...spec.eval, model: spec.eval.model && { ...spec.eval.model, url: resolve(spec.eval.model.url) } } }
      : {}),
  };
}
