import type { ReactNode } from 'react';

/** A page's heading and a line saying what it is for. */
export function PageHeader({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <header className="page-header">
      <h1>{title}</h1>
      {children ? <p className="lede">{children}</p> : null}
    </header>
  );
}
