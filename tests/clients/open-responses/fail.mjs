// A response that fails: streamText (the error parts and the onError callback) or generateText (the
// thrown error). OPTIONS_JSON: {"mode": "generate" | "stream", "prompt": "..."}.
import { generateText, streamText } from 'ai';
import { describeError, emit, setup } from './common.mjs';

const { model, requests, options } = setup();
const prompt = options.prompt ?? 'Say hello.';
if (options.mode === 'stream') {
  const onError = [];
  const parts = [];
  const result = streamText({ model, prompt, maxRetries: 0, onError: ({ error }) => onError.push(describeError(error)) });
  let iterationError = null;
  try {
    for await (const part of result.fullStream) {
      parts.push(
        part.type === 'error'
          ? { type: 'error', error: describeError(part.error) }
          : part.type === 'text-delta'
            ? { type: part.type, text: part.text }
            : part.type === 'finish'
              ? { type: part.type, finishReason: part.finishReason }
              : { type: part.type },
      );
    }
  } catch (error) {
    iterationError = describeError(error);
  }
  let finishReason = null;
  let finishError = null;
  try {
    finishReason = await result.finishReason;
  } catch (error) {
    finishError = describeError(error);
  }
  emit({ parts, onError, iterationError, finishReason, finishError, requests });
} else {
  try {
    const result = await generateText({ model, prompt, maxRetries: 0 });
    emit({ text: result.text, finishReason: result.finishReason, requests });
  } catch (error) {
    emit({ thrown: describeError(error), requests });
  }
}
