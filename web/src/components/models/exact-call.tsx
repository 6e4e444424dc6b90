import { useId } from 'react';
import { CopyButton } from '../common/copy-button';
import { PageLink } from '../common/page-link';
import type { ChatRequest } from './chat-stream';

// The playground's request as an application would send it: the same body, to the same gateway, with an API token
// in place of the console's session. Built from what is on the page, so what is copied is what was just tried.

/** A shell word in single quotes: a quote inside becomes '\'' (close, an escaped quote, open again). */
const shellQuote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

/** One line for a value: `{"role": "user", "content": "Hi"}`. */
function inline(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(inline).join(', ')}]`;
  if (value && typeof value === 'object')
    return `{${Object.entries(value)
      .map(([k, v]) => `${JSON.stringify(k)}: ${inline(v)}`)
      .join(', ')}}`;
  return JSON.stringify(value);
}

/** The body as a person reads it: a field a line, a message a line (JSON all the same, for curl and for JS). */
export function bodyText(request: ChatRequest): string {
  const fields = Object.entries(request).map(([k, v]) =>
    Array.isArray(v) && v.length
      ? `  ${JSON.stringify(k)}: [\n${v.map((item) => `    ${inline(item)}`).join(',\n')}\n  ]`
      : `  ${JSON.stringify(k)}: ${inline(v)}`,
  );
  return `{\n${fields.join(',\n')}\n}`;
}

export function curlCall(origin: string, request: ChatRequest): string {
  return [
    // -N: print the tokens as they arrive rather than when curl's buffer fills.
    `curl -N ${origin}/v1/chat/completions \\`,
    `  -H "Authorization: Bearer $HANGAR_TOKEN" \\`,
    `  -H 'Content-Type: application/json' \\`,
    `  -d ${shellQuote(bodyText(request))}`,
  ].join('\n');
}

export function nodeCall(origin: string, request: ChatRequest): string {
  const body = bodyText(request).replace(/\n/g, '\n  ');
  return [
    "import OpenAI from 'openai';",
    '',
    `const client = new OpenAI({ baseURL: '${origin}/v1', apiKey: process.env.HANGAR_TOKEN });`,
    '',
    'const stream = await client.chat.completions.create(',
    `  ${body},`,
    ');',
    'for await (const chunk of stream) {',
    "  process.stdout.write(chunk.choices[0]?.delta?.content ?? '');",
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a template literal of the snippet, not of this code.
    '  if (chunk.usage) console.log(`\\n${chunk.usage.completion_tokens} tokens`);',
    '}',
  ].join('\n');
}

export function ExactCall({
  origin,
  request,
  sent,
}: {
  origin: string;
  request: ChatRequest;
  /** Whether this is the request last sent (nothing typed since) rather than the one a Send would make. */
  sent: boolean;
}) {
  const titleId = useId();
  const curl = curlCall(origin, request);
  const node = nodeCall(origin, request);
  return (
    <section className="panel exact-call" aria-labelledby={titleId}>
      <h2 id={titleId} className="section-title">
        The exact call
      </h2>
      <p className="hint">
        {sent ? 'The request the playground sent last' : 'What the playground sends next'}, as an application sends it.
        An API token goes in place of <code>$HANGAR_TOKEN</code> (<code>export HANGAR_TOKEN=hgr_…</code>): make one on
        the <PageLink to="/tokens">Tokens</PageLink> page. A <strong>caller only</strong> token is the kind to hand an
        application: it may call models and nothing else of the control plane.
      </p>
      <div className="call-block">
        <div className="call-head">
          <h3>curl</h3>
          <CopyButton text={curl} label="Copy curl" />
        </div>
        <pre className="code" data-testid="call-curl">
          {curl}
        </pre>
      </div>
      <div className="call-block">
        <div className="call-head">
          <h3>
            Node, with the <code>openai</code> client
          </h3>
          <CopyButton text={node} label="Copy Node" />
        </div>
        <pre className="code" data-testid="call-node">
          {node}
        </pre>
      </div>
    </section>
  );
}
