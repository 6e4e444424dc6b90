import { Fragment } from 'react';

/**
 * An identifier ("token:ci-deploy (ops@example.com)", "qwen3-8b/v1") that a narrow column wraps after its
 * separators ("@", ":", "/" or ".") and nowhere else: the parts keep whole (CSS .breakable-part, no break at
 * their hyphens either), so an email reads "a-rather-long-name." / "of-an-operator@" / "example.com", not a few
 * letters a line. Each part is a span of its own, so a test can see that none of them broke.
 */
export function Breakable({ text }: { text: string }) {
  const parts = text.split(/(?<=[@:/.])/);
  return (
    <>
      {parts.map((part, i) => (
        // The parts of one string, in order: their place is their identity.
        // biome-ignore lint/suspicious/noArrayIndexKey: see above
        <Fragment key={i}>
          <span className="breakable-part">{part}</span>
          {i < parts.length - 1 ? <wbr /> : null}
        </Fragment>
      ))}
    </>
  );
}
