// The OpenAI Agents SDK for JavaScript through the gateway: `node agent.mjs BASE_URL MODEL [OPTIONS_JSON]`.
// OPTIONS_JSON: {"stream": bool, "input": "...", "store": bool, "chain": bool}. Prints one JSON object: the
// final output, the items the run produced, every request body the SDK sent. With "chain", a first run
// (input "Hi") comes before, and the run continues from it with previousResponseId (server-side state).
import { Agent, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled, tool } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

const [baseURL, model, raw] = process.argv.slice(2);
const options = raw ? JSON.parse(raw) : {};
const requests = [];
const emit = (result) => process.stdout.write(JSON.stringify(result) + '\n');
setTimeout(() => {
  emit({ timeout: true, requests });
  process.exit(3);
}, Number(process.env.SCRIPT_TIMEOUT_MS ?? 25000)).unref();

const recordingFetch = async (url, init) => {
  if (typeof init?.body === 'string') requests.push({ url: String(url), body: JSON.parse(init.body) });
  return fetch(url, init);
};
setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey: 'unused', fetch: recordingFetch, maxRetries: 0 }));
setOpenAIAPI('responses');
setTracingDisabled(true);

const executed = [];
const getWeather = tool({
  name: 'get_weather',
  description: 'The weather in a city.',
  parameters: z.object({ city: z.string() }),
  execute: async (input) => {
    executed.push(input);
    return JSON.stringify({ city: input.city, sky: 'sunny', celsius: 21 });
  },
});
const agent = new Agent({
  name: 'Weather agent',
  instructions: 'Be helpful and brief.',
  model,
  tools: [getWeather],
  ...(options.store != null ? { modelSettings: { store: options.store } } : {}),
});

function describeError(error) {
  return { name: error?.name, message: String(error?.message ?? error), status: error?.status };
}

try {
  const input = options.input ?? 'What is the weather in Paris?';
  let runOptions = {};
  let before = null;
  if (options.chain) {
    const first = await run(agent, 'Hi');
    before = { finalOutput: first.finalOutput, lastResponseId: first.lastResponseId };
    runOptions = { previousResponseId: first.lastResponseId };
  }
  let result;
  const events = [];
  if (options.stream) {
    result = await run(agent, input, { stream: true, ...runOptions });
    for await (const event of result) {
      if (event.type === 'raw_model_stream_event') events.push(event.data.type);
      else events.push(`${event.type}:${event.name ?? event.item?.type ?? ''}`);
    }
    await result.completed;
    if (result.error) throw result.error;
  } else {
    result = await run(agent, input, runOptions);
  }
  emit({
    before,
    finalOutput: result.finalOutput,
    newItems: result.newItems.map((item) => ({ type: item.type, raw: item.rawItem })),
    responseIds: result.rawResponses.map((r) => r.responseId ?? null),
    usage: result.rawResponses.map((r) => r.usage),
    lastResponseId: result.lastResponseId ?? null,
    executed,
    events,
    requests,
  });
} catch (error) {
  emit({ thrown: describeError(error), executed, requests });
}
