// Two chat turns with generateText: the second sends the first's response.messages back as history.
// OPTIONS_JSON: {"providerOptions": {...}} (passed to both calls as is).
import { generateText } from 'ai';
import { describeError, emit, setup } from './common.mjs';

const { model, requests, options } = setup();
const call = { model, maxRetries: 0, ...(options.providerOptions ? { providerOptions: options.providerOptions } : {}) };
try {
  const first = await generateText({ ...call, prompt: 'Tell me about the first topic.' });
  const messages = [
    { role: 'user', content: 'Tell me about the first topic.' },
    ...first.response.messages,
    { role: 'user', content: 'And the second topic?' },
  ];
  const second = await generateText({ ...call, messages });
  emit({
    texts: [first.text, second.text],
    responseIds: [first.providerMetadata?.openai?.responseId, second.providerMetadata?.openai?.responseId],
    history: first.response.messages,
    requests,
  });
} catch (error) {
  emit({ thrown: describeError(error), requests });
}
