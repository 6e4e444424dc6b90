import { renderHook } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import { useHeldHeight } from './held-height';

describe("the listing's height while it scrolls", () => {
  it('grows with its rows, shrinks by no more than a screenful until the list stops, then is exact', () => {
    const { result, rerender } = renderHook(({ exact, scrolling }) => useHeldHeight(exact, scrolling, 900), {
      initialProps: { exact: 500_000, scrolling: false },
    });
    expect(result.current).toBe(500_000);

    // Rows measured while scrolling, shorter than guessed: the page keeps its height (nothing behind the rows is
    // painted again for it).
    rerender({ exact: 499_987, scrolling: true });
    expect(result.current).toBe(500_000);
    rerender({ exact: 499_950, scrolling: true });
    expect(result.current).toBe(500_000);

    // Taller than the page so far: the rows need the room at once, and a little more for the next ones.
    rerender({ exact: 500_020, scrolling: true });
    expect(result.current).toBe(500_245);
    rerender({ exact: 500_200, scrolling: true });
    expect(result.current).toBe(500_245);
    rerender({ exact: 500_001, scrolling: true });
    expect(result.current).toBe(500_245);

    // Guesses that fall by more than a screenful (the rows of a kind all shorter than first guessed) are taken at
    // once: held, they would leave that much space below the last row to scroll into.
    rerender({ exact: 480_000, scrolling: true });
    expect(result.current).toBe(480_000);
    rerender({ exact: 479_990, scrolling: true });
    expect(result.current).toBe(480_000);

    // Stopped: exactly as tall as the rows, no space left under the last one.
    rerender({ exact: 479_990, scrolling: false });
    expect(result.current).toBe(479_990);

    // Still, a row that shrinks (a form closed) takes the page's height with it at once.
    rerender({ exact: 479_800, scrolling: false });
    expect(result.current).toBe(479_800);
  });
});
