import type { Logger } from '@hangar/common/log';
import type { Llama, LlamaContextSequence, LlamaModel, Token } from 'node-llama-cpp';

// The evaluation after training, on the node (docs/training.md, "Evaluation"): the catalog model's GGUF answers
// every held-out question twice, once as the base and once with the new adapter (the GGUF adapter llama.cpp
// serves), with the same settings (greedy, the same seed), and for each answer gives the log-likelihood of the
// reference answer. The control plane scores them (server/src/train/eval-score.ts): the node only answers, so the
// scoring is the same whichever agent version ran it.

export type EvalQuestion = { set: 'pairs' | 'general'; q: string; a: string };
export type EvalAnswer = {
  set: 'pairs' | 'general';
  question: string;
  reference: string;
  baseAnswer: string;
  adapterAnswer: string;
  /** Mean log-probability per token of the reference answer after the question (natural log). */
  baseLogLikelihood: number;
  adapterLogLikelihood: number;
};

export type EvaluateInput = {
  /** The base: the catalog model's GGUF for llama.cpp; the directory of its weights for vLLM. */
  modelPath: string;
  /** The new adapter: its GGUF for llama.cpp; the PEFT directory for vLLM. */
  adapterPath: string;
  /** The GPU the job trained on, when the node has several: an engine the evaluator starts sees that one alone. */
  gpuIndex?: number;
  questions: EvalQuestion[];
  maxTokens: number;
  seed: number;
  signal?: AbortSignal;
  /** Told after each model has answered every question, for the job's message. */
  onProgress?: (done: number, total: number) => void;
};

export interface AdapterEvaluator {
  answer(input: EvaluateInput): Promise<EvalAnswer[]>;
}

export type LlamaEvaluatorOptions = {
  /** 'auto' uses the GPU build node-llama-cpp finds; false runs on the CPU. */
  gpu: string | false;
  threads?: number;
  log: Logger;
};

/** Answers with llama.cpp through node-llama-cpp, as the node's llama.cpp replicas do. */
export class LlamaEvaluator implements AdapterEvaluator {
  private llama: Promise<Llama> | undefined;

  constructor(private readonly o: LlamaEvaluatorOptions) {}

  private getLlama() {
    this.llama ??= import('node-llama-cpp').then(({ getLlama, LlamaLogLevel }) =>
      getLlama({ gpu: this.o.gpu as 'auto' | false, build: 'never', logLevel: LlamaLogLevel.error }),
    );
    return this.llama;
  }

  async answer(input: EvaluateInput): Promise<EvalAnswer[]> {
    const llama = await this.getLlama();
    const model = await llama.loadModel({ modelPath: input.modelPath });
    try {
      const prompts = await promptsFor(model, input.questions);
      const total = input.questions.length * 2;
      const base = await this.run(model, prompts, input, null, (n) => input.onProgress?.(n, total));
      const adapter = await this.run(model, prompts, input, input.adapterPath, (n) =>
        input.onProgress?.(input.questions.length + n, total),
      );
      return input.questions.map((q, i) => ({
        set: q.set,
        question: q.q,
        reference: q.a,
        baseAnswer: base[i]?.answer ?? '',
        adapterAnswer: adapter[i]?.answer ?? '',
        baseLogLikelihood: base[i]?.logLikelihood ?? LOG_LIKELIHOOD_FLOOR,
        adapterLogLikelihood: adapter[i]?.logLikelihood ?? LOG_LIKELIHOOD_FLOOR,
      }));
    } finally {
      await model.dispose();
    }
  }

  /** Every question through one context, with or without the adapter. */
  private async run(
    model: LlamaModel,
    prompts: { prompt: Token[]; reference: Token[] }[],
    input: EvaluateInput,
    adapterPath: string | null,
    onDone: (n: number) => void,
  ) {
    const longest = Math.max(...prompts.map((p) => p.prompt.length + Math.max(p.reference.length, input.maxTokens)));
    const context = await model.createContext({
      contextSize: Math.min(model.trainContextSize, Math.max(256, longest + 8)),
      sequences: 1,
      threads: this.o.threads,
      lora: adapterPath ? { adapters: [{ filePath: adapterPath }] } : undefined,
    });
    try {
      const out: { answer: string; logLikelihood: number }[] = [];
      // The context's one sequence, cleared before each question: every answer starts from the same state.
      const sequence = context.getSequence();
      for (const [i, p] of prompts.entries()) {
        input.signal?.throwIfAborted();
        const answer = await greedyAnswer(model, sequence, p.prompt, input.maxTokens, input.seed);
        const logLikelihood = await referenceLogLikelihood(sequence, p.prompt, p.reference);
        out.push({ answer, logLikelihood });
        onDone(i + 1);
      }
      return out;
    } finally {
      await context.dispose();
    }
  }
}

/**
 * Each question as the model's chat template puts a user turn (the trainer trains on the same template), and the
 * reference answer's tokens that should follow it.
 */
async function promptsFor(model: LlamaModel, questions: EvalQuestion[]) {
  const { resolveChatWrapper } = await import('node-llama-cpp');
  const wrapper = resolveChatWrapper(model);
  return questions.map((q) => {
    const { contextText } = wrapper.generateContextState({
      chatHistory: [
        { type: 'user', text: q.q },
        { type: 'model', response: [] },
      ],
    });
    return { prompt: contextText.tokenize(model.tokenizer), reference: model.tokenize(q.a) };
  });
}

/** Greedy: the most likely token each time, until the end of the turn or maxTokens. */
async function greedyAnswer(
  model: LlamaModel,
  sequence: LlamaContextSequence,
  prompt: Token[],
  maxTokens: number,
  seed: number,
) {
  await sequence.clearHistory();
  const tokens: Token[] = [];
  for await (const t of sequence.evaluate(prompt, { temperature: 0, seed })) {
    if (model.isEogToken(t)) break;
    tokens.push(t);
    if (tokens.length >= maxTokens) break;
  }
  return model.detokenize(tokens).trim();
}

/** The mean log-probability of each reference token given the prompt and the reference tokens before it. */
async function referenceLogLikelihood(sequence: LlamaContextSequence, prompt: Token[], reference: Token[]) {
  if (!reference.length) return 0;
  await sequence.clearHistory();
  const all = [...prompt, ...reference];
  // The logits after position i predict token i + 1: asked for from the prompt's last token on.
  const from = prompt.length - 1;
  const results = await sequence.controlledEvaluate(
    all.slice(0, -1).map((t, i) => (i >= from ? ([t, { generateNext: { logits: true } }] as const) : t)),
  );
  let sum = 0;
  for (let k = 0; k < reference.length; k++) {
    const logits = results[from + k]?.next.logits;
    if (!logits) throw new Error(`llama.cpp returned no logits for reference token ${k}`);
    let max = Number.NEGATIVE_INFINITY;
    for (const v of logits.values()) if (v > max) max = v;
    let total = 0;
    for (const v of logits.values()) total += Math.exp(v - max);
    const target = logits.get(reference[k] as Token) ?? Number.NEGATIVE_INFINITY;
    sum += target - max - Math.log(total);
  }
  await sequence.clearHistory();
  // A floor (e^-100 per token): an adapter that broke the model can give the reference no probability at all, and
  // -Infinity or NaN would swamp every mean and interval it enters.
  const mean = sum / reference.length;
  return Number.isFinite(mean) ? Math.max(mean, LOG_LIKELIHOOD_FLOOR) : LOG_LIKELIHOOD_FLOOR;
}

const LOG_LIKELIHOOD_FLOOR = -100;
