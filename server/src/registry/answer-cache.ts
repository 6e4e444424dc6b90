// Answers are kept briefly: an operator paging back and forth should not wait on the registry each time, and a set
// the explorer has just judged is not read a second time to fetch it. A failed answer is forgotten at once.

const CACHE_MS = 60_000;
/** Past this many answers the oldest goes: a long session of browsing does not grow the server without bound. */
const CACHE_MAX = 500;

export class AnswerCache {
  private readonly answers = new Map<string, { at: number; value: Promise<unknown> }>();

  get<T>(key: string, load: () => Promise<T>): Promise<T> {
    const hit = this.answers.get(key);
    if (hit && Date.now() - hit.at < CACHE_MS) return hit.value as Promise<T>;
    const value = load();
    this.answers.set(key, { at: Date.now(), value });
    value.catch(() => this.answers.delete(key));
    if (this.answers.size > CACHE_MAX) this.answers.delete(this.answers.keys().next().value as string);
    return value;
  }

  /** Forgets one answer: a fetch resolves a branch now, not from the explorer's answer of a minute ago. */
  forget(key: string) {
    this.answers.delete(key);
  }
}
