// Structured output: generateText with output: Output.object({schema}) (a zod schema).
// OPTIONS_JSON: {"prompt": "...", "maxOutputTokens": N}.
import { generateText, Output } from 'ai';
import { z } from 'zod';
import { describeError, emit, setup } from './common.mjs';

const { model, requests, options } = setup();
const schema = z.object({ city: z.string(), celsius: z.number() });
try {
  const result = await generateText({
    model,
    prompt: options.prompt ?? 'Give the city and temperature as JSON: Paris, 21 degrees.',
    output: Output.object({ schema, name: 'weather' }),
    maxRetries: 0,
    ...(options.maxOutputTokens ? { maxOutputTokens: options.maxOutputTokens } : {}),
    ...(options.temperature != null ? { temperature: options.temperature } : {}),
  });
  emit({
    output: result.output,
    text: result.text,
    finishReason: result.finishReason,
    usage: result.usage,
    responseId: result.providerMetadata?.openai?.responseId ?? null,
    warnings: result.warnings ?? [],
    requests,
  });
} catch (error) {
  emit({ thrown: describeError(error), requests });
}
