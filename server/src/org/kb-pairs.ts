// Turning a collection's documents into question/answer pairs, the parts that need no model: the passages a model
// is shown (chunks), what it is asked, and reading what it answers. Models answer in many shapes (a JSON array,
// the same inside a code fence or after a sentence, one object per line, "Q: … A: …" text), so the reading is
// lenient about the shape and strict about the content: every pair has a non-empty question and answer.

export type Chunk = { documentId: string; documentName: string; index: number; text: string };
export type Pair = { q: string; a: string };
export type ParsedPairs = {
  pairs: Pair[] /** Why nothing, or some, could not be read: for the progress log. */;
  notes: string[];
};

/** Passages of at most `maxChars`, cut between paragraphs, else between sentences, else hard. */
export function chunkText(text: string, maxChars = 1500): string[] {
  const pieces = text
    .split(/\n\s*\n/)
    .map((p) => p.trim())
    .filter(Boolean)
    .flatMap((p) => (p.length <= maxChars ? [p] : splitLong(p, maxChars)));
  const chunks: string[] = [];
  let current = '';
  for (const piece of pieces) {
    if (current && current.length + 2 + piece.length > maxChars) {
      chunks.push(current);
      current = '';
    }
    current = current ? `${current}\n\n${piece}` : piece;
  }
  if (current) chunks.push(current);
  return chunks;
}

function splitLong(paragraph: string, maxChars: number): string[] {
  const sentences = paragraph.match(/[^.!?]+(?:[.!?]+|$)\s*/g) ?? [paragraph];
  const out: string[] = [];
  let current = '';
  for (const raw of sentences) {
    const sentence = raw.trim();
    if (!sentence) continue;
    if (current && current.length + 1 + sentence.length > maxChars) {
      out.push(current);
      current = '';
    }
    if (sentence.length > maxChars) {
      for (let i = 0; i < sentence.length; i += maxChars) out.push(sentence.slice(i, i + maxChars));
      continue;
    }
    current = current ? `${current} ${sentence}` : sentence;
  }
  if (current) out.push(current);
  return out;
}

/** Every document's chunks, in order. */
export function chunkDocuments(docs: { id: string; name: string; text: string }[], maxChars = 1500): Chunk[] {
  return docs.flatMap((d) =>
    chunkText(d.text, maxChars).map((text, index) => ({ documentId: d.id, documentName: d.name, index, text })),
  );
}

/** The chat messages that ask for `count` pairs grounded in one passage. */
export function pairPrompt(chunk: Chunk, count: number): { role: 'system' | 'user'; content: string }[] {
  return [
    {
      role: 'system',
      content:
        'You write training data. Answer only with a JSON array of objects {"q": "...", "a": "..."}: questions a reader of the passage could ask, answered only from the passage. No text outside the array.',
    },
    {
      role: 'user',
      content: `Write ${count} question/answer pairs about this passage from "${chunk.documentName}".\n\n<passage>\n${chunk.text}\n</passage>`,
    },
  ];
}

const MAX_FIELD_CHARS = 4000;

/** The pairs in a model's answer, whatever shape it chose; duplicates and empty fields dropped. */
export function parsePairs(answer: string): ParsedPairs {
  const notes: string[] = [];
  const found = fromJson(answer) ?? fromLines(answer) ?? fromText(answer);
  if (!found) return { pairs: [], notes: [`no pairs in the answer (${describe(answer)})`] };
  const seen = new Set<string>();
  const pairs: Pair[] = [];
  let empty = 0;
  let long = 0;
  let repeated = 0;
  for (const p of found) {
    const q = clean(p.q);
    const a = clean(p.a);
    if (!q || !a) {
      empty++;
      continue;
    }
    if (q.length > MAX_FIELD_CHARS || a.length > MAX_FIELD_CHARS) {
      long++;
      continue;
    }
    const key = `${q}\u0001${a}`;
    if (seen.has(key)) {
      repeated++;
      continue;
    }
    seen.add(key);
    pairs.push({ q, a });
  }
  if (empty) notes.push(`${empty} without a question or an answer`);
  if (long) notes.push(`${long} longer than ${MAX_FIELD_CHARS} characters`);
  if (repeated) notes.push(`${repeated} repeated`);
  return { pairs, notes };
}

/** The pairs as a training job takes them (train/data.ts): one {"q","a","collection"} per line. */
export function pairsNdjson(pairs: Pair[], collectionId: string): string {
  return pairs.map((p) => JSON.stringify({ q: p.q, a: p.a, collection: collectionId })).join('\n');
}

function describe(answer: string): string {
  const t = answer.trim();
  if (!t) return 'it was empty';
  return `it began ${JSON.stringify(t.slice(0, 60))}`;
}

function clean(v: unknown): string {
  if (typeof v === 'number') return String(v);
  if (typeof v !== 'string') return '';
  return v
    .replaceAll(String.fromCharCode(0), '')
    .replace(/^\s*\*\*|\*\*\s*$/g, '')
    .trim();
}

type Loose = { q: unknown; a: unknown };

function pick(o: unknown): Loose | null {
  if (typeof o !== 'object' || o === null || Array.isArray(o)) return null;
  const entries = Object.entries(o as Record<string, unknown>).map(([k, v]) => [k.toLowerCase(), v] as const);
  const get = (...names: string[]) => entries.find(([k]) => names.includes(k))?.[1];
  const q = get('q', 'question', 'prompt', 'instruction');
  const a = get('a', 'answer', 'response', 'output');
  return q === undefined && a === undefined ? null : { q, a };
}

/** A JSON array (or {"pairs": [...]}, or one object), alone, fenced, or inside prose. */
function fromJson(answer: string): Loose[] | null {
  const candidates: string[] = [];
  for (const m of answer.matchAll(/```(?:json)?\s*([\s\S]*?)```/gi)) candidates.push(m[1] as string);
  candidates.push(answer);
  const first = answer.indexOf('[');
  const last = answer.lastIndexOf(']');
  if (first >= 0 && last > first) candidates.push(answer.slice(first, last + 1));
  const firstObj = answer.indexOf('{');
  const lastObj = answer.lastIndexOf('}');
  if (firstObj >= 0 && lastObj > firstObj) candidates.push(answer.slice(firstObj, lastObj + 1));
  for (const c of candidates) {
    const v = parseJson(c.trim());
    if (v === undefined) continue;
    const list = Array.isArray(v)
      ? v
      : typeof v === 'object' && v !== null && Array.isArray((v as { pairs?: unknown }).pairs)
        ? (v as { pairs: unknown[] }).pairs
        : [v];
    const pairs = list.map(pick).filter((p): p is Loose => p !== null);
    if (pairs.length) return pairs;
  }
  return null;
}

function parseJson(text: string): unknown {
  for (const t of [text, text.replace(/,\s*([\]}])/g, '$1')]) {
    try {
      return JSON.parse(t);
    } catch {}
  }
  return undefined;
}

/** One JSON object per line (NDJSON), as a model that was shown the training format may answer. */
function fromLines(answer: string): Loose[] | null {
  const pairs = answer
    .split('\n')
    .map((l) => l.trim().replace(/,$/, ''))
    .filter((l) => l.startsWith('{'))
    .map((l) => pick(parseJson(l)))
    .filter((p): p is Loose => p !== null);
  return pairs.length ? pairs : null;
}

/** "Q: … A: …" text: numbered, bulleted or in bold, each part on one line or several. */
function fromText(answer: string): Loose[] | null {
  const label =
    /^\s*(?:[-*]\s*)?(?:\d+[.)]\s*)?(?:\*\*)?\s*(q|question|a|answer)\s*\d*\s*(?:\*\*)?\s*[:.)-]\s*(?:\*\*)?\s*/i;
  const pairs: Loose[] = [];
  let q: string | null = null;
  let a: string | null = null;
  let into: 'q' | 'a' | null = null;
  const flush = () => {
    if (q !== null && a !== null) pairs.push({ q, a });
    q = null;
    a = null;
  };
  for (const line of answer.split('\n')) {
    const m = label.exec(line);
    if (m) {
      const isQ = (m[1] as string).toLowerCase().startsWith('q');
      if (isQ) flush();
      const rest = line.slice(m[0].length);
      // "Q: … A: …" on one line.
      const inline = isQ ? /\s(?:\*\*)?(?:A|Answer)(?:\*\*)?\s*:\s*(?:\*\*)?/.exec(rest) : null;
      if (inline) {
        q = rest.slice(0, inline.index);
        a = rest.slice(inline.index + inline[0].length);
        into = 'a';
        continue;
      }
      if (isQ) q = rest;
      else a = rest;
      into = isQ ? 'q' : 'a';
    } else if (into && line.trim()) {
      if (into === 'q') q = `${q ?? ''} ${line.trim()}`;
      else a = `${a ?? ''} ${line.trim()}`;
    }
  }
  flush();
  return pairs.length ? pairs : null;
}
