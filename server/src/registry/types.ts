import type { ModelFacts } from '@hangar/common/gguf/facts';
import type { MemoryEstimate } from '@hangar/common/gguf/memory';
import type { Verdict } from '@hangar/common/gguf/verdict';
import type { FileSet } from './sets.js';

// What the registry's repository queries answer: a repository, its file sets and how each would run here.

export type NodeFit = { node: string; fits: boolean; freeMiB: number; neededMiB: number; reason: string };
export type JudgedSet = FileSet & {
  model: string;
  version: string;
  facts: ModelFacts | null;
  headerError: string | null;
  headerBytesRead: number;
  verdict: Verdict;
  memory: MemoryEstimate | null;
  fits: { disk: { fits: boolean; freeBytes: number; neededBytes: number }; nodes: NodeFit[]; summary: string };
};
export type RegistryRepo = {
  id: string;
  revision: string;
  shortRevision: string;
  gated: boolean;
  /** Null when the files can be downloaded; otherwise why not (gated without access). */
  noAccess: string | null;
  architecture: string | null;
  url: string;
  cardHtml: string | null;
  sets: JudgedSet[];
  context: number | null;
};
