import type { Logger } from '@hangar/common/log';
import type { Llama, LlamaModel } from 'node-llama-cpp';

// Token counts for a job's pairs, with the model's own tokenizer: the trainer cuts each pair at max_len tokens,
// and characters say little about where that falls (code and non-Latin scripts take many more tokens per
// character than English prose). llama.cpp reads only the vocabulary from the GGUF (vocab_only), so this costs
// megabytes and milliseconds even for a model of tens of GB.

const KEEP = 2;

export class Tokenizers {
  private llama: Promise<Llama> | undefined;
  private readonly models = new Map<string, Promise<LlamaModel>>();

  private readonly log: Logger;

  constructor(deps: { log: Logger }) {
    this.log = deps.log;
  }

  /** The token count of each text, by the tokenizer in `file` (a GGUF). */
  async count(file: string, texts: string[]): Promise<number[]> {
    const model = await this.model(file);
    return texts.map((t) => model.tokenize(t).length);
  }

  private model(file: string): Promise<LlamaModel> {
    let m = this.models.get(file);
    if (!m) {
      m = this.runtime().then((llama) => llama.loadModel({ modelPath: file, vocabOnly: true }));
      m.catch(() => this.models.delete(file));
      this.models.set(file, m);
      // A few tokenizers stay loaded (the models an operator trains for); older ones are let go.
      while (this.models.size > KEEP) {
        const [oldest, loaded] = this.models.entries().next().value as [string, Promise<LlamaModel>];
        this.models.delete(oldest);
        void loaded.then((x) => x.dispose()).catch(() => {});
      }
    }
    return m;
  }

  private runtime(): Promise<Llama> {
    this.llama ??= import('node-llama-cpp').then(({ getLlama, LlamaLogLevel }) =>
      getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error }),
    );
    this.llama.catch((err) => {
      this.log.warn('llama.cpp could not start to count tokens', { error: err });
      this.llama = undefined;
    });
    return this.llama;
  }

  async dispose() {
    for (const m of this.models.values()) await (await m.catch(() => null))?.dispose();
    this.models.clear();
    await (await this.llama?.catch(() => null))?.dispose();
  }
}
