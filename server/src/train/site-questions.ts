import fs from 'node:fs/promises';
import path from 'node:path';
import { ConfigError } from '../config.js';
import { checkTrainData } from './data.js';
import { MAX_HELD_OUT, MIN_HELD_OUT, pairsAtLines } from './eval-split.js';
import { GENERAL_QUESTIONS } from './general-questions.js';

// The general questions an adapter is evaluated on to catch forgetting (docs/training.md, "Evaluation"): Hangar's
// own 16, or the operator's, named in hangar.yaml beside the rest of the site's settings:
//
//   training:
//     generalQuestions: general.ndjson     # NDJSON of {"q": "…", "a": "…"}; relative to hangar.yaml
//
// A site's own questions are ones its base model should keep answering (its domain, its languages), which Hangar's
// trivia cannot know. Read and checked at every start: a bad file stops the start with its path and line, rather
// than quietly evaluating against Hangar's questions while the operator believes their own are used.

export type GeneralQuestion = { q: string; a: string };

/** The site's general questions from `configFile`'s `training.generalQuestions`; Hangar's own without one. */
export async function readGeneralQuestions(configFile: string | undefined): Promise<readonly GeneralQuestion[]> {
  if (!configFile) return GENERAL_QUESTIONS;
  const { parseDocument, LineCounter, isMap } = await import('yaml');
  const lines = new LineCounter();
  const doc = parseDocument(await fs.readFile(configFile, 'utf8'), { lineCounter: lines });
  const training = doc.get('training', true);
  if (!isMap(training)) return GENERAL_QUESTIONS;
  const node = training.get('generalQuestions', true) as { value?: unknown; range?: [number, number, number] } | null;
  if (node === undefined || node === null) return GENERAL_QUESTIONS;
  const at = `HANGAR_CONFIG=${configFile}, line ${node.range ? lines.linePos(node.range[0]).line : 0} (training.generalQuestions)`;
  const value = node.value;
  if (typeof value !== 'string' || !value.trim()) {
    throw new ConfigError(`${at}: the path of an NDJSON file of {"q": "…", "a": "…"}, relative to hangar.yaml`);
  }
  const file = path.resolve(path.dirname(configFile), value);
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    throw new ConfigError(
      `${at}: cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? String(err)}): fix the path`,
    );
  }
  const report = checkTrainData(text);
  const bad = report.errors[0];
  if (bad) {
    throw new ConfigError(`${at}: ${file}, line ${bad.line}: ${bad.message}`);
  }
  const questions = pairsAtLines(text, 'all');
  // Fewer than the verdict needs would make every forgetting verdict INSUFFICIENT_DATA: no gate at all.
  if (questions.length < MIN_HELD_OUT || questions.length > MAX_HELD_OUT) {
    throw new ConfigError(
      `${at}: ${file} has ${questions.length} distinct questions; ${MIN_HELD_OUT} to ${MAX_HELD_OUT} are accepted (each is answered twice on the node after training)`,
    );
  }
  return questions;
}

/** The general questions in force: Hangar's until `load` has read the site's at start (app.ts). */
export class SiteGeneralQuestions {
  private questions: readonly GeneralQuestion[] = GENERAL_QUESTIONS;

  async load(configFile: string | undefined) {
    this.questions = await readGeneralQuestions(configFile);
  }

  current(): GeneralQuestion[] {
    return [...this.questions];
  }
}
