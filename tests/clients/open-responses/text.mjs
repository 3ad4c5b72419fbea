// generateText or streamText on a plain prompt. OPTIONS_JSON: {"mode": "generate" | "stream", "prompt": "..."}.
import { generateText, streamText } from 'ai';
import { describeError, emit, setup } from './common.mjs';

const { model, requests, options } = setup();
const prompt = options.prompt ?? 'Say hello.';
// Optional call settings, passed as is (the test checks what the provider makes of them).
const settings = {};
for (const key of ['system', 'temperature', 'topP', 'maxOutputTokens', 'presencePenalty', 'frequencyPenalty', 'reasoning', 'providerOptions']) {
  if (options[key] != null) settings[key] = options[key];
}

function describeReasoning(reasoning) {
  return (reasoning ?? []).map((r) => ({ text: r.text, providerMetadata: r.providerMetadata ?? null }));
}

try {
  if (options.mode === 'stream') {
    const parts = [];
    const errors = [];
    const result = streamText({
      ...settings,
      model,
      prompt,
      maxRetries: 0,
      onChunk: ({ chunk }) => parts.push(chunk.type === 'reasoning-delta' ? `reasoning-delta:${chunk.text}` : chunk.type),
      onError: ({ error }) => errors.push(describeError(error)),
    });
    const deltas = [];
    for await (const delta of result.textStream) deltas.push(delta);
    emit({
      deltas,
      text: await result.text,
      reasoningText: (await result.reasoningText) ?? null,
      reasoning: describeReasoning(await result.reasoning),
      usage: await result.usage,
      finishReason: await result.finishReason,
      rawFinishReason: (await result.rawFinishReason) ?? null,
      response: { id: (await result.response).id, modelId: (await result.response).modelId },
      warnings: (await result.warnings) ?? [],
      parts,
      errors,
      requests,
    });
  } else {
    const result = await generateText({ ...settings, model, prompt, maxRetries: 0 });
    emit({
      text: result.text,
      reasoningText: result.reasoningText ?? null,
      reasoning: describeReasoning(result.reasoning),
      usage: result.usage,
      finishReason: result.finishReason,
      rawFinishReason: result.rawFinishReason ?? null,
      response: { id: result.response.id, modelId: result.response.modelId },
      warnings: result.warnings ?? [],
      requests,
    });
  }
} catch (error) {
  emit({ thrown: describeError(error), requests });
}
