// Shared by the scripts here: each is run as `node SCRIPT.mjs BASE_URL MODEL [OPTIONS_JSON]` by
// tests/test_real_open_responses.py and prints one JSON object on stdout.
import { createOpenResponses } from '@ai-sdk/open-responses';

// The provider name: the key of providerMetadata / providerOptions.
export const NAME = 'gateway';

export function setup({ recordRaw = false } = {}) {
  const [baseURL, modelId, options] = process.argv.slice(2);
  if (!baseURL || !modelId) {
    console.error('usage: node SCRIPT.mjs BASE_URL MODEL [OPTIONS_JSON]');
    process.exit(2);
  }
  // Every request the SDK sends (url, headers, body as sent): the test asserts on these.
  // With recordRaw, also the raw text of every response body (SSE comments included), as it came.
  const requests = [];
  const raw = [];
  const recordingFetch = async (url, init) => {
    if (typeof init?.body === 'string') {
      requests.push({
        url: String(url),
        headers: Object.fromEntries(new Headers(init.headers ?? {}).entries()),
        body: JSON.parse(init.body),
      });
    }
    const response = await fetch(url, init);
    if (!recordRaw || response.body == null) return response;
    const [mine, copy] = response.body.tee();
    raw.push(new Response(copy).text());
    return new Response(mine, { status: response.status, statusText: response.statusText, headers: response.headers });
  };
  const provider = createOpenResponses({
    name: NAME,
    url: `${baseURL}/responses`,
    apiKey: process.env.GATEWAY_KEY,
    fetch: recordingFetch,
  });
  // A script that hangs is a failure the test can read, not a stuck test run.
  setTimeout(() => {
    emit({ timeout: true, requests });
    process.exit(3);
  }, Number(process.env.SCRIPT_TIMEOUT_MS ?? 25000)).unref();
  return {
    model: provider(modelId),
    requests,
    rawBodies: () => Promise.all(raw),
    options: options ? JSON.parse(options) : {},
  };
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
