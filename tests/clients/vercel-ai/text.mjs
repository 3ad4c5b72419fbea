// generateText or streamText on a plain prompt. OPTIONS_JSON: {"mode": "generate" | "stream"}.
import { generateText, streamText } from 'ai';
import { describeError, emit, setup } from './common.mjs';

const { model, requests, options } = setup();
const prompt = options.prompt ?? 'Say hello.';
try {
  if (options.mode === 'stream') {
    const parts = [];
    const errors = [];
    const result = streamText({
      model,
      prompt,
      maxRetries: 0,
      onChunk: ({ chunk }) => parts.push(chunk.type),
      onError: ({ error }) => errors.push(describeError(error)),
    });
    const deltas = [];
    for await (const delta of result.textStream) deltas.push(delta);
    emit({
      deltas,
      text: await result.text,
      reasoningText: (await result.reasoningText) ?? null,
      usage: await result.usage,
      finishReason: await result.finishReason,
      providerMetadata: await result.providerMetadata,
      warnings: (await result.warnings) ?? [],
      parts,
      errors,
      requests,
    });
  } else {
    const result = await generateText({ model, prompt, maxRetries: 0 });
    emit({
      text: result.text,
      reasoningText: result.reasoningText ?? null,
      usage: result.usage,
      finishReason: result.finishReason,
      providerMetadata: result.providerMetadata,
      warnings: result.warnings ?? [],
      requests,
    });
  }
} catch (error) {
  emit({ thrown: describeError(error), requests });
}
