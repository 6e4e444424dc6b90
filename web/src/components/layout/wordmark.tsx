/** The small "Hangar" mark: a hangar's arch over the name. */
export function Wordmark() {
  return (
    <span className="wordmark">
      <svg viewBox="0 0 20 16" width="20" height="16" aria-hidden="true">
        <path d="M1 15V8a9 7 0 0 1 18 0v7" fill="none" stroke="currentColor" strokeWidth="2" />
        <path d="M6 15v-4h8v4" fill="none" stroke="currentColor" strokeWidth="2" />
      </svg>
      Hangar
    </span>
  );
}
