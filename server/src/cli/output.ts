// Where a command's answer goes: stdout is for what a script reads (a table, or JSON with --json), stderr for
// what a person watches (progress, notes). Tests swap both.

export type Out = {
  json: boolean;
  /** The answer: a line of text, or (with --json) one JSON document per call, on one line. */
  result(human: string, data: unknown): void;
  /** A note for the person at the terminal, on stderr; never mixed into --json output. */
  note(line: string): void;
};

export function output(json: boolean): Out {
  return {
    json,
    result: (human, data) => {
      process.stdout.write(json ? `${JSON.stringify(data)}\n` : `${human}\n`);
    },
    note: (line) => {
      process.stderr.write(`${line}\n`);
    },
  };
}
