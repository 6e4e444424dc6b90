import { createContext, useContext, useEffect, useState } from 'react';

/**
 * Whether the listing is being scrolled, for the rows' form controls. Every `<select>` or `<input>` that comes into
 * the page makes Chromium's autofill look over every form control there again, a forced style and layout for each
 * (about 270 of them and 2–7 ms a row on the Mirror page, more than the row's own React and paint), and again when
 * it leaves. Scrolled through rows of versions in use, one came in nearly every frame. So a row that comes into view
 * while the list moves shows its controls as look-alikes, and the real ones once it stops.
 */
export type ListScrolling = {
  scrolling: boolean;
  /** Called once, when scrolling stops; returns the way to stop listening. */
  onSettle: (listener: () => void) => () => void;
  set: (scrolling: boolean) => void;
};

export function createListScrolling(): ListScrolling {
  const waiting = new Set<() => void>();
  const state: ListScrolling = {
    scrolling: false,
    onSettle(listener) {
      waiting.add(listener);
      return () => {
        waiting.delete(listener);
      };
    },
    set(scrolling) {
      state.scrolling = scrolling;
      if (scrolling) return;
      const now = [...waiting];
      waiting.clear();
      for (const l of now) l();
    },
  };
  return state;
}

export const ListScrollingContext = createContext<ListScrolling | undefined>(undefined);

/**
 * False while the row came into view during a scroll and the list has not stopped since; true from then on (a real
 * control is never swapped back). Outside a scrolled list (a row rendered alone) always true.
 */
export function useSettled(): boolean {
  const list = useContext(ListScrollingContext);
  const [settled, setSettled] = useState(() => !list?.scrolling);
  useEffect(() => {
    if (settled || !list) return;
    if (!list.scrolling) {
      setSettled(true);
      return;
    }
    return list.onSettle(() => setSettled(true));
  }, [settled, list]);
  return settled;
}
