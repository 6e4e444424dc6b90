import { execFileSync } from 'node:child_process';
import { render, screen, waitFor, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it, vi } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { chatRequest } from './chat-stream';
import { curlCall, nodeCall } from './exact-call';
import { ModelPage, ModelPage_ModelQuery } from './model-page';

const now = new Date().toISOString();

function model(over: Record<string, unknown> = {}) {
  return {
    __typename: 'Model',
    id: 'm-qwen',
    name: 'qwen3-8b',
    source: 'http://hangar.test/mirror/qwen3-8b/Q4_K_M/',
    engine: 'llamacpp',
    contextSize: 8192,
    memoryBytes: 6 * 1024 ** 3,
    measuredMemoryBytes: null,
    memoryEstimateError: null,
    parallel: 1,
    mode: 'ALWAYS',
    wantedReplicas: 1,
    // The model page's Autoscaling panel (model-scaling.tsx): a fixed count, no decision yet.
    minReplicas: 1,
    maxReplicas: 1,
    targetInFlight: null,
    scalingDecisions: [],
    declared: false,
    declaredIn: null,
    modeMessage: 'always: the replicas it wants run',
    routing: 'PREFIX',
    fallbacks: [],
    awakeUntil: null,
    adapters: [
      { __typename: 'Adapter', id: 'a1', name: 'support-tone', source: 'http://x/a.gguf', owner: 'team:support' },
    ],
    replicas: [
      {
        __typename: 'Replica',
        id: 'r1',
        state: 'READY',
        desired: 'RUN',
        message: null,
        smokeText: null,
        tokensPerSecond: 41.5,
        timeToFirstTokenMs: 120,
        endpoint: null,
        gpuLayers: null,
        totalLayers: null,
        vramUsedBytes: null,
        memoryMeasured: false,
        cards: [],
        updatedAt: now,
        node: { __typename: 'Node', id: 'n1', name: 'gpu-1' },
      },
    ],
    ...over,
  };
}

const sse = (content: string) =>
  new TextEncoder().encode(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content } }], usage: null })}\n\n`);

/**
 * A gateway whose answers the test writes piece by piece: each request gets a stream the test pushes to, and a
 * Stop errors it as a real fetch does when its signal aborts.
 */
function liveGateway() {
  const requests: Record<string, unknown>[] = [];
  const streams: ReadableStreamDefaultController<Uint8Array>[] = [];
  const fetchImpl = vi.fn(async (_url: string, init: RequestInit) => {
    requests.push(JSON.parse(init.body as string));
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        streams.push(controller);
        init.signal?.addEventListener('abort', () =>
          controller.error(new DOMException('The operation was aborted.', 'AbortError')),
        );
      },
    });
    return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } });
  });
  return { fetchImpl: fetchImpl as unknown as typeof fetch, requests, streams };
}

function renderPage(o: { fetchImpl?: typeof fetch; call?: string; onCallChange?: (c: string | undefined) => void }) {
  const fake = fakeClient([
    answer(ModelPage_ModelQuery, ({ name }) => ({ model: name === 'qwen3-8b' ? model() : null })),
  ]);
  return render(
    <Provider value={fake.client}>
      <ModelPage
        name="qwen3-8b"
        canChange
        call={o.call}
        onCallChange={o.onCallChange ?? (() => {})}
        fetchImpl={o.fetchImpl}
      />
    </Provider>,
  );
}

describe('the playground', () => {
  it('streams the answer in as it arrives, with time to first token and tokens per second, and Stop ends it', async () => {
    const gateway = liveGateway();
    renderPage({ fetchImpl: gateway.fetchImpl });
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText('System prompt (optional)'), 'Be brief.');
    await user.type(screen.getByLabelText('Message'), 'Why is the sky blue?');
    await user.click(screen.getByRole('button', { name: 'Send' }));

    await waitFor(() => expect(gateway.streams).toHaveLength(1));
    expect(gateway.requests[0]).toEqual({
      model: 'qwen3-8b',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Why is the sky blue?' },
      ],
      stream: true,
      stream_options: { include_usage: true },
    });
    const conversation = screen.getByRole('list', { name: 'Conversation' });
    const stream = gateway.streams[0] as ReadableStreamDefaultController<Uint8Array>;
    stream.enqueue(sse('Rayleigh'));
    const answerText = await within(conversation).findByText('Rayleigh');
    stream.enqueue(sse(' scattering'));
    await waitFor(() => expect(answerText).toHaveTextContent('Rayleigh scattering'));
    expect(screen.getByTestId('answer-stats')).toHaveTextContent(
      /^first token \d+ ms · [\d.]+ tokens\/s · 2 tokens so far$/,
    );
    expect(screen.queryByRole('button', { name: 'Send' })).toBeNull();

    await user.click(screen.getByRole('button', { name: 'Stop' }));
    await waitFor(() => expect(screen.getByTestId('answer-stats')).toHaveTextContent(/· Stopped\.$/));
    expect(answerText).toHaveTextContent('Rayleigh scattering');
    expect(screen.getByTestId('answer-stats')).toHaveTextContent('2 tokens (counted as they came)');

    // With nothing typed, the call to copy is the request just tried.
    expect(screen.getByText(/^The request the playground sent last/)).toBeVisible();
    expect(screen.getByTestId('call-curl')).toHaveTextContent('{"role": "user", "content": "Why is the sky blue?"}');
    expect(screen.getByTestId('call-curl')).not.toHaveTextContent('Hello!');

    // The next question carries the conversation, the stopped answer as far as it got.
    await user.type(screen.getByLabelText('Message'), 'Shorter.{Enter}');
    await waitFor(() => expect(gateway.requests).toHaveLength(2));
    expect((gateway.requests[1] as { messages: unknown[] }).messages).toEqual([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Why is the sky blue?' },
      { role: 'assistant', content: 'Rayleigh scattering' },
      { role: 'user', content: 'Shorter.' },
    ]);
  });

  it('says the gateway’s refusal in its own words (OpenAI’s error.message)', async () => {
    const message = 'The model `support-tone` does not exist or you do not have access to it.';
    const fetchImpl = (async () =>
      new Response(
        JSON.stringify({ error: { message, type: 'invalid_request_error', param: null, code: 'model_not_found' } }),
        { status: 404, headers: { 'content-type': 'application/json' } },
      )) as unknown as typeof fetch;
    renderPage({ fetchImpl, call: 'support-tone' });
    const user = userEvent.setup();
    await user.type(await screen.findByLabelText('Message'), 'Hello{Enter}');
    const conversation = await screen.findByRole('list', { name: 'Conversation' });
    expect(await within(conversation).findByRole('alert')).toHaveTextContent(message);
    // Refused before the first token: no figures ("0 tokens" would read as an empty answer).
    expect(within(conversation).queryByText(/tokens/)).toBeNull();
    // The turn names what was called.
    expect(within(conversation).getByText('support-tone')).toBeVisible();
  });

  it('calls the adapter the URL names, and the copied call names it with this origin', async () => {
    const onCallChange = vi.fn();
    const view = renderPage({ call: 'support-tone', onCallChange });
    const picker = await screen.findByLabelText('Model or adapter');
    expect(picker).toHaveValue('support-tone');
    expect(
      within(picker)
        .getAllByRole('option')
        .map((o) => o.textContent),
    ).toEqual(['qwen3-8b (the model)', 'support-tone (adapter · team:support)']);
    const curl = screen.getByTestId('call-curl').textContent ?? '';
    expect(curl).toContain(`curl -N ${window.location.origin}/v1/chat/completions`);
    expect(curl).toContain('"model": "support-tone"');
    expect(screen.getByTestId('call-node')).toHaveTextContent(
      `new OpenAI({ baseURL: '${window.location.origin}/v1', apiKey: process.env.HANGAR_TOKEN })`,
    );
    // What is typed is what the copied call sends.
    await userEvent.type(screen.getByLabelText('Message'), 'Reset my router');
    expect(screen.getByTestId('call-curl')).toHaveTextContent('"content": "Reset my router"');
    expect(screen.getByText(/caller only/)).toBeVisible();
    expect(screen.getByRole('link', { name: 'Tokens' })).toHaveAttribute('href', '/tokens');

    await userEvent.selectOptions(picker, 'qwen3-8b');
    expect(onCallChange).toHaveBeenLastCalledWith(undefined);
    view.unmount();
  });

  it('says so when the catalog holds no such model', async () => {
    const fake = fakeClient([answer(ModelPage_ModelQuery, () => ({ model: null }))]);
    render(
      <Provider value={fake.client}>
        <ModelPage name="gone" canChange call={undefined} onCallChange={() => {}} />
      </Provider>,
    );
    expect(await screen.findByText(/The catalog holds no model named gone/)).toBeVisible();
    expect(screen.queryByRole('region', { name: 'Playground' })).toBeNull();
  });
});

describe('the exact call', () => {
  const request = chatRequest({
    model: 'support-tone',
    messages: [
      { role: 'system', content: "Answer as the support desk's tone: it's short." },
      { role: 'user', content: 'Hi $USER `id`' },
    ],
    maxTokens: 32,
  });

  it('quotes the body for the shell: what curl is handed is the JSON the playground sends', () => {
    const curl = curlCall('http://hangar.test:4000', request);
    // Run the command line by a real shell, with printf standing in for curl: each argument on its own line.
    const args = execFileSync('sh', ['-c', curl.replace(/^curl /, "printf '%s\\n' ")], {
      env: { HANGAR_TOKEN: 'hgr_test' },
    }).toString();
    const body = args.split('\n-d\n')[1];
    expect(args).toContain('-N\nhttp://hangar.test:4000/v1/chat/completions\n-H\nAuthorization: Bearer hgr_test\n');
    expect(JSON.parse((body as string).trimEnd())).toEqual(request);
  });

  it('gives the openai client the gateway’s base URL and the same body', () => {
    const node = nodeCall('http://hangar.test:4000', request);
    expect(node).toContain("new OpenAI({ baseURL: 'http://hangar.test:4000/v1', apiKey: process.env.HANGAR_TOKEN })");
    const body = /create\(\n {2}([\s\S]*),\n\);/.exec(node)?.[1];
    expect(JSON.parse(body as string)).toEqual(request);
  });
});
