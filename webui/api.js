// The server, as the Web UI sees it: the OpenAI API (models, streamed chat completions) plus
// llaisys's cancel and session endpoints. Every failure becomes an ApiError with a message a
// person can act on.

export class ApiError extends Error {
  constructor(message, status = 0, retryAfter = null) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

function headers(apiKey, extra = {}) {
  const h = { 'content-type': 'application/json', ...extra };
  if (apiKey) h.authorization = `Bearer ${apiKey}`;
  return h;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch {
    // Not an OpenAI error object: keep the status line.
  }
  const retry = response.headers.get('retry-after');
  if (response.status === 429) message = `The server is busy (429): ${message}` + (retry ? ` Retry in ${retry} s.` : '');
  if (response.status === 401) message = `The server wants an API key (401): ${message} Set it in the settings (⚙).`;
  if (response.status === 503) message = `The server is shutting down or unavailable (503): ${message}`;
  return new ApiError(message, response.status, retry);
}

async function request(path, init) {
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(`Cannot reach the server (${e.message}). Is llaisys running?`);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

export async function listModels(apiKey) {
  const response = await request('/v1/models', { headers: headers(apiKey) });
  const body = await response.json();
  return body.data.map((m) => ({ id: m.id, context: m.max_model_len, vision: (m.input_modalities || []).includes('image') }));
}

// Streams one chat completion. Calls onStart(requestId from the server) once the response
// starts, onDelta(text) per content delta in order, onReasoning(text) per delta of a reasoning
// model's thinking (delta.reasoning_content), onToolCall(piece) per delta.tool_calls
// entry ({index, id and function.name once, function.arguments in pieces}), and resolves with
// { finishReason, usage }. Rejects with ApiError on HTTP errors, on an error inside the stream
// and when the stream breaks off without finishing.
export async function streamChat(body, { apiKey, requestId, signal, onStart, onDelta, onReasoning = () => {}, onToolCall = () => {} }) {
  const response = await request('/v1/chat/completions', {
    method: 'POST',
    headers: headers(apiKey, { 'x-request-id': requestId }),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  onStart(response.headers.get('x-request-id') || requestId);
  const reader = response.body.getReader();
  // stream: true keeps a multi-byte character whole even when the network splits it.
  const decoder = new TextDecoder('utf-8');
  let buffer = '';
  let finishReason = null;
  let usage = null;
  let done = false;
  const handle = (data) => {
    if (data === '[DONE]') { done = true; return; }
    const chunk = JSON.parse(data);
    if (chunk.error) throw new ApiError(`The generation failed: ${chunk.error.message}`, chunk.error.code || 500);
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices || []) {
      const thinking = choice.delta?.reasoning_content ?? choice.delta?.reasoning;
      if (thinking) onReasoning(thinking);
      if (choice.delta && choice.delta.content) onDelta(choice.delta.content);
      for (const piece of choice.delta?.tool_calls || []) onToolCall(piece);
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
  };
  try {
    for (;;) {
      const { value, done: eof } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !eof });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split('\n')) if (line.startsWith('data: ')) handle(line.slice(6));
      }
      if (eof) break;
    }
  } catch (e) {
    if (e instanceof ApiError || e.name === 'AbortError') throw e;
    throw new ApiError(`The stream broke off: ${e.message}`);
  }
  if (!done || !finishReason) throw new ApiError('The stream ended before the answer was finished.');
  return { finishReason, usage };
}

// Asks the server to end a running request; its stream then finishes with reason "abort".
export async function cancel(requestId, apiKey) {
  await request(`/v1/requests/${encodeURIComponent(requestId)}/cancel`, { method: 'POST', headers: headers(apiKey) });
}

// Frees a conversation's cached KV cells on the server (nothing to free is fine).
export async function deleteSession(sessionId, apiKey) {
  try {
    await request(`/v1/sessions/${encodeURIComponent(sessionId)}`, { method: 'DELETE', headers: headers(apiKey) });
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 404)) throw e;
  }
}
