// streamText through a model that goes silent longer than the gateway's keepalive interval: the stream
// must still complete. Prints what the SDK returned and the raw SSE text the gateway sent.
// OPTIONS_JSON: {"prompt": "..."}.
import { streamText } from 'ai';
import { describeError, emit, setup } from './common.mjs';

const { model, requests, rawBodies, options } = setup({ recordRaw: true });
try {
  const parts = [];
  const errors = [];
  const result = streamText({
    model,
    prompt: options.prompt ?? 'Take your time.',
    maxRetries: 0,
    onError: ({ error }) => errors.push(describeError(error)),
  });
  for await (const part of result.fullStream) {
    parts.push(part.type === 'text-delta' ? { type: part.type, text: part.text } : { type: part.type });
  }
  emit({
    text: await result.text,
    finishReason: await result.finishReason,
    usage: await result.usage,
    parts,
    errors,
    raw: await rawBodies(),
    requests,
  });
} catch (error) {
  emit({ thrown: describeError(error), requests });
}
