/**
 * What the listing guesses a row not rendered yet measures, by its class of row: what the last one of that class
 * measured, but not while the list scrolls. Each change of a guess moves the place of every row not yet measured
 * (5000 of them): a guess 13 px off moved the table's height by 13 px for each, 60,000 px, with every row of its
 * class measured other than the one before, and each change of the page's height made Chromium paint the page
 * behind the rows again (bench/console-mirror.ts: "list height changes"). So while the list
 * moves, a class keeps the guess it has (only the rows measured move the height, each by its own few pixels) and
 * takes the last one measured once it stops. A class with no guess yet takes its first measurement at once.
 */
export type SizeGuesses<C extends string> = {
  of: (c: C) => number;
  measured: (c: C, size: number, scrolling: boolean) => void;
  /** The list stopped: the sizes measured while it moved become the guesses. */
  settled: () => void;
};

export function createSizeGuesses<C extends string>(initial: Record<C, number>): SizeGuesses<C> {
  const guesses = { ...initial };
  const measuredOnce = new Set<C>();
  let whileScrolling: Partial<Record<C, number>> = {};
  return {
    of: (c) => guesses[c],
    measured(c, size, scrolling) {
      if (scrolling && measuredOnce.has(c)) {
        whileScrolling[c] = size;
        return;
      }
      guesses[c] = size;
      measuredOnce.add(c);
    },
    settled() {
      Object.assign(guesses, whileScrolling);
      whileScrolling = {};
    },
  };
}
