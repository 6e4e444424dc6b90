import { describe, expect, it } from 'vitest';
import { checkTrainData } from '../train/data.js';
import { chunkDocuments, chunkText, pairPrompt, pairsNdjson, parsePairs } from './kb-pairs.js';

// The parts of turning a collection into pairs that need no model: the passages, the question asked, and reading
// the answers in every shape models give them. What comes out must be pairs the training data report accepts.

describe('chunks', () => {
  it('cuts between paragraphs, then sentences, never over the limit, losing no word', () => {
    const paragraphs = [
      'Returns are accepted within 30 days. Keep the receipt.',
      'Parcels leave within two days.',
      `${'Warranty covers parts and labour. '.repeat(12)}`.trim(),
      'Call support on weekdays.',
    ];
    const text = paragraphs.join('\n\n');
    const chunks = chunkText(text, 120);
    expect(chunks.every((c) => c.length <= 120)).toBe(true);
    // The first two paragraphs fit together; the long one is cut between its sentences.
    expect(chunks[0]).toBe(`${paragraphs[0]}\n\n${paragraphs[1]}`);
    expect(chunks.slice(1, -1).every((c) => c.endsWith('labour.'))).toBe(true);
    const words = (s: string) => s.split(/\s+/).filter(Boolean);
    expect(words(chunks.join(' '))).toEqual(words(text));

    const docs = chunkDocuments(
      [
        { id: 'd1', name: 'a.md', text: 'One.' },
        { id: 'd2', name: 'b.txt', text: text },
      ],
      120,
    );
    expect(docs[0]).toEqual({ documentId: 'd1', documentName: 'a.md', index: 0, text: 'One.' });
    expect(docs.filter((c) => c.documentId === 'd2').map((c) => c.index)).toEqual(chunks.map((_, i) => i));
    const prompt = pairPrompt(docs[0] as (typeof docs)[number], 3);
    expect(prompt[1]?.content).toContain('Write 3 question/answer pairs about this passage from "a.md"');
    expect(prompt[1]?.content).toContain('<passage>\nOne.\n</passage>');
  });
});

describe('answers', () => {
  const expected = [
    { q: 'How long are returns accepted?', a: 'Within 30 days.' },
    { q: 'What must be kept?', a: 'The receipt.' },
  ];

  it.each([
    ['a bare JSON array', JSON.stringify(expected)],
    [
      'a fenced array after a sentence, with a trailing comma',
      'Sure! Here are the pairs:\n```json\n[\n {"q": "How long are returns accepted?", "a": "Within 30 days."},\n {"q": "What must be kept?", "a": "The receipt."},\n]\n```\nHope this helps.',
    ],
    [
      'an object holding "pairs", with question/answer keys',
      `{"pairs": [{"Question": "How long are returns accepted?", "Answer": "Within 30 days."}, {"question": "What must be kept?", "answer": "The receipt."}]}`,
    ],
    ['one object per line', expected.map((p) => JSON.stringify(p)).join('\n')],
    [
      'numbered Q:/A: text in bold, one part over two lines',
      '1. **Q:** How long are returns accepted?\n**A:** Within 30\ndays.\n\n2. **Q:** What must be kept?\n**A:** The receipt.',
    ],
    [
      'Question/Answer on one line each',
      'Question: How long are returns accepted? Answer: Within 30 days.\nQuestion: What must be kept? Answer: The receipt.',
    ],
  ])('reads %s', (_shape, answer) => {
    expect(parsePairs(answer)).toEqual({ pairs: expected, notes: [] });
  });

  it('drops empty, repeated and over-long pairs, saying how many, and reads nothing from prose', () => {
    const r = parsePairs(
      JSON.stringify([
        ...expected,
        { q: 'What must be kept?', a: 'The receipt.' },
        { q: '  ', a: 'orphan answer' },
        { q: 'Long?', a: 'x'.repeat(5000) },
        { other: 'shape' },
      ]),
    );
    expect(r).toEqual({
      pairs: expected,
      notes: ['1 without a question or an answer', '1 longer than 4000 characters', '1 repeated'],
    });
    expect(parsePairs('I cannot help with that.')).toEqual({
      pairs: [],
      notes: ['no pairs in the answer (it began "I cannot help with that.")'],
    });
    expect(parsePairs('')).toEqual({ pairs: [], notes: ['no pairs in the answer (it was empty)'] });
  });

  it('gives pairs the training data report accepts, each naming the collection they came from', () => {
    const collection = '5f1f6f55-3c11-4a36-9d51-0b8f3f0c2a10';
    const tricky = [...expected, { q: 'Is "quoted" text\nkept?', a: 'Yes, with ünïcode and a \\ backslash.' }];
    const report = checkTrainData(pairsNdjson(tricky, collection));
    expect(report).toMatchObject({ pairs: 3, errorCount: 0, duplicateCount: 0, collections: [collection] });
  });
});
