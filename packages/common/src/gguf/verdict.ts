import { architecture, newestBuild, removedArchitecture } from './catalog.js';

export type Verdict = { servable: boolean; reason: string; neededBuild: number | null };

// Architectures llama.cpp knows but that are not text models to serve on their own.
const notMainModels: Record<string, string> = {
  clip: 'a vision/audio projector (mmproj): it is loaded beside a model with --mmproj, never as a model',
  'wavtokenizer-dec': 'a speech vocoder, not a text model',
  eagle3: 'a speculative-decoding draft head, not a model on its own',
  dflash: 'a speculative-decoding draft head, not a model on its own',
  'gemma4-assistant': 'a speculative-decoding draft head, not a model on its own',
};

/**
 * Whether a llama.cpp of the given build loads this architecture, and why not. "qwen3 needs llama.cpp b5092;
 * the nodes run b4748" is what an operator needs before an hour of download, not a failed replica after it.
 */
export function verdictFor(arch: string | null, build: number, buildSource: string): Verdict {
  if (!arch)
    return { servable: false, reason: 'the header names no architecture (general.architecture)', neededBuild: null };
  const special = notMainModels[arch];
  if (special) return { servable: false, reason: special, neededBuild: null };
  const gone = removedArchitecture(arch);
  const known = architecture(arch);
  if (!known) {
    if (gone?.removed_build && build >= gone.removed_build) {
      return {
        servable: false,
        reason: `llama.cpp removed ${arch} in b${gone.removed_build}; ${buildSource} b${build}`,
        neededBuild: null,
      };
    }
    return {
      servable: false,
      reason: `llama.cpp (up to b${newestBuild}) has no architecture named ${arch}`,
      neededBuild: null,
    };
  }
  if (known.impl_build === null && known.note?.includes('not loadable')) {
    return { servable: false, reason: `llama.cpp names ${arch} but never implemented it`, neededBuild: null };
  }
  const needed = known.impl_build ?? known.since_build;
  if (build < needed) {
    return {
      servable: false,
      reason: `${arch} needs llama.cpp b${needed}; ${buildSource} b${build}`,
      neededBuild: needed,
    };
  }
  return {
    servable: true,
    reason: `${arch} loads in llama.cpp b${needed} and later; ${buildSource} b${build}`,
    neededBuild: needed,
  };
}
