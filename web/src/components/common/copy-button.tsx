import { useEffect, useState } from 'react';

/** Copies text to the clipboard and says so for a moment (the clipboard needs https or localhost). */
export function CopyButton({ text, label = 'Copy' }: { text: string; label?: string }) {
  const [state, setState] = useState<'idle' | 'copied' | 'failed'>('idle');
  useEffect(() => {
    if (state === 'idle') return;
    const t = setTimeout(() => setState('idle'), 2500);
    return () => clearTimeout(t);
  }, [state]);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(text);
      setState('copied');
    } catch {
      setState('failed');
    }
  };
  return (
    <button type="button" className="button small" onClick={copy}>
      {state === 'copied' ? 'Copied' : state === 'failed' ? 'Copy failed: select the text instead' : label}
    </button>
  );
}
