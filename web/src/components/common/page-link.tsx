import { useRouter } from '@tanstack/react-router';
import type { MouseEvent, ReactNode } from 'react';

/**
 * A link to another console page that works inside the router (no reload) and in a component rendered alone, as
 * the unit tests do (a plain link there). A click with a modifier opens a tab as any link does.
 */
export function PageLink({ to, children, className }: { to: string; children: ReactNode; className?: string }) {
  const router = useRouter({ warn: false }) as ReturnType<typeof useRouter> | undefined;
  const onClick = (e: MouseEvent<HTMLAnchorElement>) => {
    if (!router || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    void router.navigate({ href: to });
  };
  return (
    <a href={to} className={className} onClick={onClick}>
      {children}
    </a>
  );
}
