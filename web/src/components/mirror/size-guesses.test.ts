import { describe, expect, it } from 'vitest';
import { createSizeGuesses } from './size-guesses';

describe("the listing's guesses at rows not rendered yet", () => {
  it('keeps each class its guess while the list scrolls, and takes the last one measured once it stops', () => {
    const guesses = createSizeGuesses({ used: 132, version: 100 });
    // The rows in view when the page opens, the list still: their sizes are the guesses at once.
    guesses.measured('used', 101, false);
    expect(guesses.of('used')).toBe(101);

    // Scrolled through rows in use of 101 and 114 px (URLs that wrap on more lines or fewer): the guess stays, so
    // the place of every row not measured yet (and the page's height) does not swing with each.
    guesses.measured('used', 114, true);
    expect(guesses.of('used')).toBe(101);
    guesses.measured('used', 101, true);
    guesses.measured('used', 114, true);
    expect(guesses.of('used')).toBe(101);

    // A class first met while scrolling has no measured guess to keep: it takes its first at once.
    guesses.measured('version', 77, true);
    expect(guesses.of('version')).toBe(77);
    guesses.measured('version', 90, true);
    expect(guesses.of('version')).toBe(77);

    // Stopped: the last ones measured are the guesses.
    guesses.settled();
    expect(guesses.of('used')).toBe(114);
    expect(guesses.of('version')).toBe(90);
    guesses.measured('used', 101, false);
    expect(guesses.of('used')).toBe(101);
  });
});
