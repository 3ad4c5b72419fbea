// Shared by the scripts here: each is run as `node SCRIPT.mjs BASE_URL MODEL [OPTIONS_JSON]` by
// tests/test_real_vercel_ai.py and prints one JSON object on stdout.
import { createOpenAI } from '@ai-sdk/openai';

export function setup() {
  const [baseURL, modelId, options] = process.argv.slice(2);
  if (!baseURL || !modelId) {
    console.error('usage: node SCRIPT.mjs BASE_URL MODEL [OPTIONS_JSON]');
    process.exit(2);
  }
  // Every request body the SDK sends, as it sent it: the test asserts on these.
  const requests = [];
  const recordingFetch = async (url, init) => {
    if (typeof init?.body === 'string') requests.push({ url: String(url), body: JSON.parse(init.body) });
    return fetch(url, init);
  };
  const openai = createOpenAI({ baseURL, apiKey: process.env.GATEWAY_KEY ?? 'unused', fetch: recordingFetch });
  // A script that hangs is a failure the test can read, not a stuck test run.
  setTimeout(() => {
    emit({ timeout: true, requests });
    process.exit(3);
  }, Number(process.env.SCRIPT_TIMEOUT_MS ?? 25000)).unref();
  return { model: openai.responses(modelId), requests, options: options ? JSON.parse(options) : {} };
}

export function describeError(error) {
  if (error == null) return null;
  return {
    name: error.name,
    message: String(error.message ?? error),
    statusCode: error.statusCode,
    isRetryable: error.isRetryable,
    responseBody: error.responseBody,
    data: error.data,
    text: error.text,
    cause: error.cause ? describeError(error.cause) : undefined,
  };
}

export function emit(result) {
  process.stdout.write(JSON.stringify(result, (_k, v) => (typeof v === 'bigint' ? Number(v) : v)) + '\n');
}
