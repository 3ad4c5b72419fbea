// A tool loop: a get_weather tool with `execute`, stopWhen: stepCountIs(3).
// OPTIONS_JSON: {"mode": "generate" | "stream", "prompt": "..."}.
import { generateText, stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';
import { describeError, emit, NAME, setup } from './common.mjs';

const { model, requests, rawBodies, options } = setup({ recordRaw: true });
const executed = [];
const tools = {
  get_weather: tool({
    description: 'The weather in a city.',
    inputSchema: z.object({ city: z.string() }),
    execute: async (input) => {
      executed.push(input);
      return { city: input.city, sky: 'sunny', celsius: 21 };
    },
  }),
};
const call = {
  model,
  prompt: options.prompt ?? 'What is the weather in Paris?',
  tools,
  stopWhen: stepCountIs(3),
  maxRetries: 0,
};

function describeSteps(steps) {
  return steps.map((step) => ({
    finishReason: step.finishReason,
    text: step.text,
    reasoningText: step.reasoningText ?? null,
    reasoning: (step.reasoning ?? []).map((r) => ({ text: r.text, providerMetadata: r.providerMetadata ?? null })),
    toolCalls: step.toolCalls.map((c) => ({
      toolCallId: c.toolCallId,
      toolName: c.toolName,
      input: c.input,
      itemId: c.providerMetadata?.[NAME]?.itemId ?? null,
    })),
    toolResults: step.toolResults.map((r) => ({ toolCallId: r.toolCallId, output: r.output })),
    usage: step.usage,
    warnings: step.warnings ?? [],
  }));
}

try {
  if (options.mode === 'stream') {
    const errors = [];
    const result = streamText({ ...call, onError: ({ error }) => errors.push(describeError(error)) });
    const deltas = [];
    for await (const delta of result.textStream) deltas.push(delta);
    emit({
      deltas,
      text: await result.text,
      finishReason: await result.finishReason,
      steps: describeSteps(await result.steps),
      executed,
      errors,
      raw: await rawBodies(),
      requests,
    });
  } else {
    const result = await generateText(call);
    emit({
      text: result.text,
      finishReason: result.finishReason,
      steps: describeSteps(result.steps),
      executed,
      raw: await rawBodies(),
      requests,
    });
  }
} catch (error) {
  emit({ thrown: describeError(error), executed, requests });
}
