// Drives `glmserve serve` with the official `openai` client (chat, streaming, completions,
// the Responses API, tools, errors, API keys) and parses /metrics with a Prometheus text-format parser.
// Usage: node openai_e2e.js <glmserve binary> <model dir>
'use strict';
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const OpenAI = require('openai');
const parsePrometheusTextFormat = require('parse-prometheus-text-format');

const [binary, modelDir] = process.argv.slice(2);
const API_KEY = 'sk-glmserve-e2e';

function startServer() {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, ['serve', '--model', modelDir, '--port', '0', '--served-model-name', 'tiny',
                                 '--max-model-len', '512', '--api-key', API_KEY],
                        { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    const timer = setTimeout(() => reject(new Error('server not ready:\n' + out)), 120000);
    child.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/);
      if (m && out.includes('glmserve: ready\n')) {
        clearTimeout(timer);
        resolve({ child, baseURL: m[1] });
      }
    });
    child.on('exit', (code) => reject(new Error(`server exited (${code}):\n${out}`)));
  });
}

async function main() {
  const { child, baseURL } = await startServer();
  try {
    const client = new OpenAI({ apiKey: API_KEY, baseURL: baseURL + '/v1', maxRetries: 0 });

    const models = await client.models.list();
    assert.equal(models.data[0].id, 'tiny');

    // Chat, non-streaming and streaming (greedy: the same text).
    const messages = [{ role: 'system', content: 'You write Python.' }, { role: 'user', content: 'def add(a, b):' }];
    const chat = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, temperature: 0 });
    assert.equal(chat.object, 'chat.completion');
    assert.equal(chat.choices[0].message.role, 'assistant');
    assert.equal(typeof chat.choices[0].message.content, 'string');
    assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
    assert.ok(chat.usage.prompt_tokens > 5);
    assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);
    assert.equal(typeof chat.usage.prompt_tokens_details.cached_tokens, 'number');

    const stream = await client.chat.completions.create({
      model: 'tiny', messages, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let streamed = '';
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.content) streamed += c.delta.content;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(streamed, chat.choices[0].message.content);
    assert.equal(finish, chat.choices[0].finish_reason);
    assert.equal(usage.completion_tokens, chat.usage.completion_tokens);
    // The same prompt again: its prefix comes from the cache.
    assert.ok(usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(usage));

    // Completions.
    const completion = await client.completions.create({ model: 'tiny', prompt: 'import os\n', max_tokens: 8, temperature: 0 });
    assert.equal(completion.object, 'text_completion');
    const cstream = await client.completions.create({ model: 'tiny', prompt: 'import os\n', max_tokens: 8, temperature: 0, stream: true });
    let ctext = '';
    for await (const chunk of cstream) for (const c of chunk.choices) ctext += c.text;
    assert.equal(ctext, completion.choices[0].text);

    // Tools: accepted, rendered, and a tool round trip goes through the template.
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
                     parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const withTools = await client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'auto', max_tokens: 4,
    });
    assert.ok(Array.isArray(withTools.choices[0].message.tool_calls));
    const roundTrip = await client.chat.completions.create({
      model: 'tiny', tools, max_tokens: 4,
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null,
          tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
      ],
    });
    assert.ok(roundTrip.usage.prompt_tokens > withTools.usage.prompt_tokens);

    // The Responses API: a Response, and the same text streamed as events the client's own
    // accumulator (responses.stream) turns back into that Response; a function tool round trip.
    const response = await client.responses.create({
      model: 'tiny', instructions: 'You write Python.', input: 'def add(a, b):', max_output_tokens: 10, temperature: 0,
    });
    assert.equal(response.object, 'response');
    assert.ok(['completed', 'incomplete'].includes(response.status));
    assert.equal(response.output_text, chat.choices[0].message.content);  // the same prompt as the chat above
    assert.equal(response.usage.total_tokens, response.usage.input_tokens + response.usage.output_tokens);
    const counted = await client.responses.inputTokens.count({
      model: 'tiny', instructions: 'You write Python.', input: 'def add(a, b):',
    });
    assert.equal(counted.input_tokens, response.usage.input_tokens);
    const responseStream = client.responses.stream({
      model: 'tiny', instructions: 'You write Python.', input: 'def add(a, b):', max_output_tokens: 10, temperature: 0,
    });
    let deltas = '';
    const sequence = [];
    let last = null;
    for await (const event of responseStream) {
      sequence.push(event.sequence_number);
      if (event.type === 'response.output_text.delta') deltas += event.delta;
      last = event;
    }
    const streamedResponse = await responseStream.finalResponse();
    assert.equal(deltas, response.output_text);
    const textOf = (r) => r.output.filter((item) => item.type === 'message')
                                  .flatMap((item) => item.content.map((part) => part.text)).join('');
    assert.equal(textOf(streamedResponse), response.output_text);
    // The last event is the whole Response (response.completed, or response.incomplete at the token limit,
    // which the client's accumulator leaves out of finalResponse).
    assert.equal(last.type, 'response.' + response.status);
    assert.equal(last.response.status, response.status);
    assert.deepEqual(last.response.output, response.output.map((item) => ({ ...item, id: last.response.output[0].id })));
    assert.deepEqual(sequence, sequence.map((_, i) => i));
    const responseTools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city',
                             parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } },
                                           required: ['city'] } }];
    const called = await client.responses.create({
      model: 'tiny', tools: responseTools, tool_choice: 'required', max_output_tokens: 64, input: 'Weather in Paris?',
    });
    const call = called.output.find((item) => item.type === 'function_call');
    assert.ok(call, JSON.stringify(called.output));
    assert.equal(call.name, 'get_weather');
    assert.ok(['Paris', 'Rome'].includes(JSON.parse(call.arguments).city), call.arguments);
    const answered = await client.responses.create({
      model: 'tiny', tools: responseTools, max_output_tokens: 4,
      input: [{ role: 'user', content: 'Weather in Paris?' }, call,
              { type: 'function_call_output', call_id: call.call_id, output: '{"temp_c": 21}' }],
    });
    assert.ok(answered.usage.input_tokens > called.usage.input_tokens);
    await assert.rejects(client.responses.create({ model: 'tiny', input: 'hi', previous_response_id: 'resp_1' }),
                         (e) => e instanceof OpenAI.BadRequestError && /stores no responses/.test(e.message));

    // Errors come back as the client's typed errors.
    await assert.rejects(client.chat.completions.create({ model: 'gpt-4', messages, max_tokens: 2 }),
                         (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
    await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, temperature: -1 }),
                         (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
    const wrongKey = new OpenAI({ apiKey: 'sk-wrong', baseURL: baseURL + '/v1', maxRetries: 0 });
    await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);

    // Metrics parse as Prometheus text.
    const text = await (await fetch(baseURL + '/metrics')).text();
    const families = parsePrometheusTextFormat(text);
    const byName = Object.fromEntries(families.map((f) => [f.name, f]));
    for (const name of ['glmserve:num_requests_running', 'glmserve:kv_cache_usage_perc',
                        'glmserve:time_to_first_token_seconds', 'glmserve:request_success_total',
                        'glmserve:prompt_tokens_total', 'process_resident_memory_bytes'])
      assert.ok(byName[name], `metric ${name} missing`);
    assert.equal(byName['glmserve:e2e_request_latency_seconds'].type, 'HISTOGRAM');
    assert.ok(Number(byName['glmserve:generation_tokens_total'].metrics[0].value) > 0);
    console.log('openai e2e: all checks passed');
  } finally {
    child.kill('SIGTERM');
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
