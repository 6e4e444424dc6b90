// General questions shipped with Hangar, unrelated to any team's pairs: the base and the adapter both answer them
// after training, and an adapter that answers them clearly worse than its base has forgotten something it knew
// (docs/training.md, "Evaluation"). Short, factual, with one plain answer each, so token F1 and the likelihood of
// the reference measure the same thing on every model.

export const GENERAL_QUESTIONS: readonly { q: string; a: string }[] = [
  { q: 'What is the capital of France?', a: 'Paris' },
  { q: 'How many days are there in a week?', a: 'Seven' },
  { q: 'What is 12 multiplied by 3?', a: '36' },
  { q: 'Which planet is closest to the Sun?', a: 'Mercury' },
  { q: 'What is the chemical symbol for water?', a: 'H2O' },
  { q: 'Who wrote the play Romeo and Juliet?', a: 'William Shakespeare' },
  { q: 'What is the largest ocean on Earth?', a: 'The Pacific Ocean' },
  { q: 'How many sides does a hexagon have?', a: 'Six' },
  { q: 'What gas do plants take in from the air to make food?', a: 'Carbon dioxide' },
  { q: 'What is the freezing point of water in degrees Celsius?', a: '0 degrees Celsius' },
  { q: 'What is the opposite of "hot"?', a: 'Cold' },
  { q: 'In which continent is Kenya?', a: 'Africa' },
  { q: 'What is the square root of 81?', a: '9' },
  { q: 'Which language is spoken in Brazil?', a: 'Portuguese' },
  { q: 'What do bees make?', a: 'Honey' },
  { q: 'How many minutes are in an hour?', a: '60' },
];
