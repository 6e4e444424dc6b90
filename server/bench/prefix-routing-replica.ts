import { newEngineKey } from '@hangar/agent/control-plane';
import { LlamaRuntime } from '@hangar/agent/llama-runtime';
import { createOpenAiServer } from '@hangar/agent/openai/http';
import { LlamaServedModel } from '@hangar/agent/openai/llama-model';
import { createLogger } from '@hangar/common/log';

// One replica of bench/prefix-routing.ts, in a process of its own as on a node: the agent's own serving stack
// (its OpenAI endpoint in front of real llama.cpp through node-llama-cpp, on the CPU), without the control
// channel, whose work is not what is measured. HANGAR_BENCH_GGUF: the model; HANGAR_BENCH_NAME: the catalog name it
// answers to; HANGAR_BENCH_PARALLEL: sequences (conversations it can hold); HANGAR_BENCH_REUSE=0: sequences cleared
// after each request, as Hangar did before #29. The endpoint and its engine key go back to the parent over IPC.

const file = process.env.HANGAR_BENCH_GGUF ?? '';
const name = process.env.HANGAR_BENCH_NAME ?? 'bench';
const parallel = Number(process.env.HANGAR_BENCH_PARALLEL ?? 4);
const contextSize = Number(process.env.HANGAR_BENCH_CONTEXT ?? 3072);
const reuse = process.env.HANGAR_BENCH_REUSE !== '0';

const log = createLogger('warn');
const runtime = await LlamaRuntime.create({ threads: 1, log });
const loaded = await runtime.load(file, { contextSize, parallel, promptReuse: reuse });
const served = new LlamaServedModel(name, loaded, { parallel, queueLimit: 64 });
const key = newEngineKey();
const http = createOpenAiServer({ log });
http.serve(served, key);
const base = await http.listen({ host: '127.0.0.1', port: 0 });
process.send?.({ endpoint: base, key });

process.on('disconnect', () => {
  void (async () => {
    await http.close();
    await served.drain();
    await loaded.dispose();
    await runtime.dispose(500);
    process.exit(0);
  })();
});
