import { type FormEvent, type KeyboardEvent, useEffect, useId, useRef, useState } from 'react';
import type { ModelMode } from '../../graphql/types';
import { SelectField } from '../common/field';
import { type ChatMessage, type ChatRequest, type ChatStats, chatRequest, streamChat } from './chat-stream';
import { ExactCall } from './exact-call';

// A chat with one model or one of its adapters, through the gateway as the signed-in user: the same request an
// application makes (shown beneath, to copy), so what works here works there, owner scopes included.

export type Playground_Model = {
  name: string;
  mode: ModelMode;
  adapters: { id: string; name: string; owner: string | null }[];
  replicas: { state: string }[];
};

type Answer = {
  role: 'assistant';
  content: string;
  /** The model or adapter that answered: the picker may have moved on since. */
  target: string;
  state: 'streaming' | 'done' | 'stopped' | 'failed';
  stats: ChatStats | null;
  finishReason?: string | null;
  error?: string;
};
type Turn = { role: 'user'; content: string } | Answer;

/** What an application would say next: the history as shown, without the answers that never came. */
function historyOf(turns: Turn[]): ChatMessage[] {
  return turns.filter((t) => t.content !== '').map((t) => ({ role: t.role, content: t.content }));
}

/** "first token 42 ms · 368.1 tokens/s · 120 tokens". */
export function statsWords(stats: ChatStats, streaming: boolean): string {
  const parts: string[] = [];
  if (stats.firstTokenMs != null) parts.push(`first token ${Math.round(stats.firstTokenMs)} ms`);
  if (stats.tokensPerSecond != null) parts.push(`${stats.tokensPerSecond.toFixed(1)} tokens/s`);
  const count = `${stats.tokens.toLocaleString('en')} ${stats.tokens === 1 ? 'token' : 'tokens'}`;
  // Until the engine's own count arrives (the last chunk), the figure is pieces of text counted here.
  parts.push(streaming ? `${count} so far` : stats.tokensFrom === 'usage' ? count : `${count} (counted as they came)`);
  return parts.join(' · ');
}

const endWords = (a: Answer): string | null => {
  if (a.state === 'stopped') return 'Stopped.';
  if (a.state === 'done' && a.finishReason === 'length') return 'Ended at the token limit.';
  return null;
};

/** Said before the first request when no replica is ready: what a request will meet. */
function readinessHint(model: Playground_Model): string | null {
  if (model.replicas.some((r) => r.state === 'READY')) return null;
  if (model.mode === 'STOPPED') return `${model.name} is stopped: requests are refused until its mode changes.`;
  if (model.mode === 'ON_DEMAND')
    return `No replica of ${model.name} is running: the first request wakes it and waits while it loads.`;
  return `No replica of ${model.name} is ready yet: a request now is refused with the reason.`;
}

export function Playground({
  model,
  target: wanted,
  onTargetChange,
  origin = window.location.origin,
  fetchImpl,
}: {
  model: Playground_Model;
  /** The model or adapter name to call (from the URL); anything else falls back to the model. */
  target?: string;
  onTargetChange: (target: string) => void;
  origin?: string;
  fetchImpl?: typeof fetch;
}) {
  const titleId = useId();
  const targetId = useId();
  const systemId = useId();
  const maxId = useId();
  const messageId = useId();
  const target = wanted && model.adapters.some((a) => a.name === wanted) ? wanted : model.name;
  const [system, setSystem] = useState('');
  const [maxTokens, setMaxTokens] = useState('');
  const [draft, setDraft] = useState('');
  const [turns, setTurns] = useState<Turn[]>([]);
  const [lastSent, setLastSent] = useState<ChatRequest | null>(null);
  const running = useRef<AbortController | null>(null);
  const streaming = turns.at(-1)?.role === 'assistant' && (turns.at(-1) as Answer).state === 'streaming';

  // Leaving the page stops the answer: nobody is left to read it, and the replica has other callers.
  useEffect(() => () => running.current?.abort(), []);

  const max = Number(maxTokens);
  const maxError =
    maxTokens.trim() !== '' && !(Number.isInteger(max) && max >= 1)
      ? `a whole number of tokens, at least 1, or empty for the model's limit: '${maxTokens}' is not`
      : undefined;
  const messagesFor = (next: string): ChatMessage[] => [
    ...(system.trim() ? [{ role: 'system' as const, content: system }] : []),
    ...historyOf(turns),
    { role: 'user', content: next },
  ];
  const requestFor = (next: string) =>
    chatRequest({ model: target, messages: messagesFor(next), maxTokens: maxError ? null : max || null });

  const patchAnswer = (patch: Partial<Answer>) =>
    setTurns((all) => {
      const last = all.at(-1);
      if (last?.role !== 'assistant') return all;
      return [...all.slice(0, -1), { ...last, ...patch }];
    });

  const send = async (event?: FormEvent) => {
    event?.preventDefault();
    const question = draft;
    if (!question.trim() || streaming || maxError) return;
    const request = requestFor(question);
    const controller = new AbortController();
    running.current = controller;
    setLastSent(request);
    setDraft('');
    setTurns((all) => [
      ...all,
      { role: 'user', content: question },
      { role: 'assistant', content: '', target, state: 'streaming', stats: null },
    ]);
    const outcome = await streamChat({
      request,
      signal: controller.signal,
      fetchImpl,
      onProgress: (content, stats) => patchAnswer({ content, stats }),
    });
    if (running.current === controller) running.current = null;
    if (outcome.kind === 'failed')
      patchAnswer({ content: outcome.text, stats: outcome.stats, state: 'failed', error: outcome.message });
    else
      patchAnswer({
        content: outcome.text,
        stats: outcome.stats,
        state: outcome.kind,
        finishReason: outcome.kind === 'done' ? outcome.finishReason : null,
      });
  };

  const onKeyDown = (e: KeyboardEvent<HTMLTextAreaElement>) => {
    // Enter sends, as in every chat; Shift+Enter starts a new line.
    if (e.key === 'Enter' && !e.shiftKey && !e.nativeEvent.isComposing) {
      e.preventDefault();
      void send();
    }
  };

  const hint = readinessHint(model);
  // The call to copy: what Send would send with what is typed; with nothing typed, the request just tried (while
  // it still names what is picked), else a first message to start from.
  const call = draft.trim() ? requestFor(draft) : lastSent?.model === target ? lastSent : requestFor('Hello!');
  return (
    <>
      <section className="panel playground" aria-labelledby={titleId}>
        <h2 id={titleId} className="section-title">
          Playground
        </h2>
        <p className="hint">
          Requests go through the gateway (<code>/v1/chat/completions</code>) as you, with your access: an adapter whose
          owner does not admit you answers as one that does not exist.
        </p>
        <div className="playground-settings">
          <SelectField id={targetId} label="Model or adapter" value={target} onChange={onTargetChange}>
            <option value={model.name}>{model.name} (the model)</option>
            {model.adapters.map((a) => (
              <option key={a.id} value={a.name}>
                {a.name} (adapter · {a.owner ?? 'everyone'})
              </option>
            ))}
          </SelectField>
          <div className="field">
            <label htmlFor={maxId}>Max tokens</label>
            <input
              id={maxId}
              className="max-tokens"
              inputMode="numeric"
              placeholder="model's limit"
              value={maxTokens}
              aria-invalid={maxError ? true : undefined}
              aria-describedby={maxError ? `${maxId}-error` : undefined}
              onChange={(e) => setMaxTokens(e.target.value)}
            />
          </div>
          <div className="field grow">
            <label htmlFor={systemId}>System prompt (optional)</label>
            <textarea id={systemId} rows={2} value={system} onChange={(e) => setSystem(e.target.value)} />
          </div>
        </div>
        {maxError ? (
          <p id={`${maxId}-error`} role="alert" className="form-error">
            Max tokens: {maxError}.
          </p>
        ) : null}
        {hint ? <p className="hint">{hint}</p> : null}
        {turns.length ? (
          <ol className="chat" aria-label="Conversation" aria-live="polite">
            {turns.map((t, i) => (
              // The conversation only grows, and a turn never moves: its place is its identity.
              // biome-ignore lint/suspicious/noArrayIndexKey: see above.
              <li key={i} className={`chat-turn ${t.role}`}>
                <div className="chat-who">{t.role === 'user' ? 'You' : t.target}</div>
                <div className="chat-text" data-testid={t.role === 'assistant' ? 'answer' : undefined}>
                  {t.content ||
                    (t.role === 'assistant' && t.state === 'streaming' ? (
                      // An on-demand model wakes first: the wait can be a model's load time, not a hang.
                      <span className="muted">waiting for the first token…</span>
                    ) : (
                      ''
                    ))}
                </div>
                {t.role === 'assistant' ? <AnswerFooter answer={t} /> : null}
              </li>
            ))}
          </ol>
        ) : null}
        <form className="chat-form" onSubmit={send} noValidate>
          <div className="field grow">
            <label htmlFor={messageId}>Message</label>
            <textarea
              id={messageId}
              rows={3}
              value={draft}
              placeholder="Ask something. Enter sends, Shift+Enter starts a new line."
              onChange={(e) => setDraft(e.target.value)}
              onKeyDown={onKeyDown}
            />
          </div>
          <div className="chat-actions">
            {streaming ? (
              <button type="button" className="button" onClick={() => running.current?.abort()}>
                Stop
              </button>
            ) : (
              <button type="submit" className="button primary" disabled={!draft.trim() || !!maxError}>
                Send
              </button>
            )}
            <button
              type="button"
              className="button"
              disabled={streaming || !turns.length}
              onClick={() => {
                setTurns([]);
                setLastSent(null);
              }}
            >
              Clear
            </button>
          </div>
        </form>
      </section>
      <ExactCall origin={origin} request={call} sent={call === lastSent} />
    </>
  );
}

function AnswerFooter({ answer }: { answer: Answer }) {
  const end = endWords(answer);
  return (
    <>
      {/* A refusal before the first token has no figures worth a line: "0 tokens" would read as an empty answer. */}
      {answer.stats && answer.stats.tokens > 0 ? (
        <div className="chat-stats muted" data-testid="answer-stats">
          {statsWords(answer.stats, answer.state === 'streaming')}
          {end ? ` · ${end}` : ''}
        </div>
      ) : end ? (
        <div className="chat-stats muted">{end}</div>
      ) : null}
      {answer.error ? (
        <p role="alert" className="form-error chat-error">
          {answer.error}
        </p>
      ) : null}
    </>
  );
}
