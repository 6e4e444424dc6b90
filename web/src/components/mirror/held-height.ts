import { useRef } from 'react';

/**
 * The listing's height while it scrolls: grown when its rows need more, not shrunk by less than `most` until the
 * list stops, then exact. Every row measured for the first time moves the virtualised table's height (its guess for
 * the rows not yet rendered was a few pixels off), and each change of the page's height made Chromium paint the
 * whole page behind the rows again (the shell's background and the table's frame are sized by it): about a
 * screenful of tiles rastered again, several times a second, at 5000 versions. Held, the height changes only when
 * the rows outgrow it (it then grows by a quarter of `most` more), or their guesses fall by more than `most` (a
 * screenful: no more space than that is ever left below the last row while the scroll goes on), and once more when
 * the list stops.
 */
export function heldHeight(held: number, exact: number, scrolling: boolean, most: number): number {
  if (!scrolling) return exact;
  // Outgrown: grown by a little more, so the next rows a few pixels taller than guessed fit in it too.
  if (exact > held) return exact + most / 4;
  return held - exact <= most ? held : exact;
}

/** `heldHeight` across renders of one list. */
export function useHeldHeight(exact: number, scrolling: boolean, most: number): number {
  const held = useRef(exact);
  held.current = heldHeight(held.current, exact, scrolling, most);
  return held.current;
}
