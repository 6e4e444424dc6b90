import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import { newEngineKey } from './control-plane.js';
import { startExternalEngine, vllmArgs } from './engines/external.js';
import type { AdapterEvaluator, EvalAnswer, EvaluateInput } from './train-evaluate.js';

// The evaluation of a vLLM model's PEFT adapter (docs/training.md, "Evaluation"), as the llama.cpp one does it for
// the GGUF adapter: vLLM's OpenAI server started on the base's weights with the new adapter as a LoRA module, and
// each held-out and general question answered by the base and by the adapter (a request naming the module) with
// the same settings: greedy, the job's seed, the same prompt tokens. The reference's log-likelihood comes from
// vLLM's `prompt_logprobs`: the question's prompt followed by the reference's tokens, sent as the prompt of a
// completion, returns each prompt token's log-probability under the model asked.

const LOG_LIKELIHOOD_FLOOR = -100;
/** The name requests give the adapter: a LoRA module of this one engine, seen by nobody else. */
const ADAPTER = 'evaluated-adapter';
const BASE = 'evaluated-base';

export type VllmEvaluatorOptions = {
  /** `vllm serve` (HANGAR_AGENT_VLLM_COMMAND, or vllm on PATH); null when the node has no vLLM. */
  command: () => Promise<string[] | null>;
  /** The address it binds: loopback, since only this agent calls it. */
  host?: string;
  /** How long vLLM may take to load the base (HANGAR_AGENT_ENGINE_READY_MS; 10 minutes otherwise). */
  readyMs?: number;
  log: Logger;
};

/** vLLM's PromptLogprobs: null for the first prompt token, then {token id: {logprob, rank, decoded_token}}. */
type PromptLogprobs = ({ [tokenId: string]: { logprob: number | null } } | null)[];

export class VllmEvaluator implements AdapterEvaluator {
  constructor(private readonly o: VllmEvaluatorOptions) {}

  /** `modelPath`: the base's directory of weights (config.json, safetensors); `adapterPath`: the PEFT directory. */
  async answer(input: EvaluateInput): Promise<EvalAnswer[]> {
    const command = await this.o.command();
    if (!command)
      throw new Error(
        'the model is served by vLLM and this node has none to evaluate its PEFT adapter with (no vllm on PATH, no HANGAR_AGENT_VLLM_COMMAND)',
      );
    const key = newEngineKey();
    const host = this.o.host ?? '127.0.0.1';
    // vLLM refuses a module above --max-lora-rank (16 unless raised): raised to fit this adapter's rank.
    const rank = await fs
      .readFile(path.join(input.adapterPath, 'adapter_config.json'), 'utf8')
      .then((t) => Number((JSON.parse(t) as { r?: unknown }).r) || 0)
      .catch(() => 0);
    const engine = await startExternalEngine({
      kind: 'vllm',
      command,
      args: vllmArgs({ model: BASE, contextSize: null }, input.modelPath, [`${ADAPTER}=${input.adapterPath}`], rank),
      host,
      key,
      readyMs: this.o.readyMs ?? 10 * 60_000,
      graceMs: 10_000,
      env: input.gpuIndex === undefined ? undefined : { CUDA_VISIBLE_DEVICES: String(input.gpuIndex) },
      signal: input.signal,
    });
    try {
      const api = new VllmApi(`http://${host.includes(':') ? `[${host}]` : host}:${engine.port}`, key, input.signal);
      // One prompt per question, from vLLM's own chat template, and the reference's tokens: both models get these.
      const prompts: { prompt: number[]; reference: number[] }[] = [];
      for (const q of input.questions) {
        prompts.push({
          prompt: await api.tokenize({
            model: BASE,
            messages: [{ role: 'user', content: q.q }],
            add_generation_prompt: true,
          }),
          reference: await api.tokenize({ model: BASE, prompt: q.a, add_special_tokens: false }),
        });
      }
      const total = input.questions.length * 2;
      const run = async (model: string, offset: number) => {
        const out: { answer: string; logLikelihood: number }[] = [];
        for (const [i, p] of prompts.entries()) {
          input.signal?.throwIfAborted();
          const answer = await api.complete({
            model,
            prompt: p.prompt,
            max_tokens: input.maxTokens,
            temperature: 0,
            seed: input.seed,
          });
          out.push({ answer: answer.text.trim(), logLikelihood: await referenceLogLikelihood(api, model, p) });
          input.onProgress?.(offset + i + 1, total);
        }
        return out;
      };
      const base = await run(BASE, 0);
      const adapter = await run(ADAPTER, input.questions.length);
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
      await engine.stop();
    }
  }
}

/**
 * The mean log-probability per token of the reference after the prompt: one completion whose prompt is the prompt
 * and the reference, with `prompt_logprobs: 0` (each prompt token's own log-probability, no alternatives).
 */
async function referenceLogLikelihood(api: VllmApi, model: string, p: { prompt: number[]; reference: number[] }) {
  if (!p.reference.length) return 0;
  const got = await api.complete({
    model,
    prompt: [...p.prompt, ...p.reference],
    max_tokens: 1,
    temperature: 0,
    prompt_logprobs: 0,
  });
  const logprobs = got.prompt_logprobs;
  if (!Array.isArray(logprobs) || logprobs.length !== p.prompt.length + p.reference.length)
    throw new Error(
      `vLLM answered no prompt_logprobs for the ${p.prompt.length + p.reference.length} prompt tokens it was sent (an engine without prompt_logprobs support?)`,
    );
  let sum = 0;
  for (const [k, token] of p.reference.entries()) {
    const v = logprobs[p.prompt.length + k]?.[String(token)]?.logprob;
    sum += typeof v === 'number' && Number.isFinite(v) ? v : Number.NEGATIVE_INFINITY;
  }
  // A floor (e^-100 per token), as for llama.cpp: an adapter that broke the model can give the reference no
  // probability at all, and -Infinity would swamp every mean and interval it enters.
  const mean = sum / p.reference.length;
  return Number.isFinite(mean) ? Math.max(mean, LOG_LIKELIHOOD_FLOOR) : LOG_LIKELIHOOD_FLOOR;
}

/** The two vLLM routes the evaluation uses, with the engine's key; an error answer is thrown in vLLM's words. */
class VllmApi {
  constructor(
    private readonly base: string,
    private readonly key: string,
    private readonly signal?: AbortSignal,
  ) {}

  private async post<T>(route: string, body: unknown): Promise<T> {
    const res = await fetch(`${this.base}${route}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${this.key}` },
      body: JSON.stringify(body),
      signal: this.signal,
    });
    const text = await res.text();
    if (!res.ok) {
      let message = text.trim().slice(0, 300);
      try {
        const parsed = JSON.parse(text) as { message?: string; error?: { message?: string } };
        message = parsed.error?.message ?? parsed.message ?? message;
      } catch {}
      throw new Error(`vLLM answered ${route} with HTTP ${res.status}: ${message}`);
    }
    return JSON.parse(text) as T;
  }

  async tokenize(body: Record<string, unknown>): Promise<number[]> {
    const r = await this.post<{ tokens?: unknown }>('/tokenize', body);
    if (!Array.isArray(r.tokens) || !r.tokens.every((t) => Number.isInteger(t)))
      throw new Error('vLLM answered /tokenize without its token ids');
    return r.tokens as number[];
  }

  async complete(body: Record<string, unknown>) {
    const r = await this.post<{ choices?: { text?: string; prompt_logprobs?: PromptLogprobs | null }[] }>(
      '/v1/completions',
      body,
    );
    const choice = r.choices?.[0];
    if (!choice) throw new Error('vLLM answered /v1/completions without a choice');
    return { text: choice.text ?? '', prompt_logprobs: choice.prompt_logprobs ?? null };
  }
}
