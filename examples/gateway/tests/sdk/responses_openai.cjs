// Drives a gateway's Responses route with the official `openai` npm package.
// Usage: node responses_openai.cjs BASE_URL MODEL MODE [PREVIOUS_RESPONSE_ID]  (NODE_PATH finds openai)
// MODE: create-stream | helper | once | tools-helper | previous
//   create-stream  client.responses.create({stream: true}), iterated raw
//   helper         client.responses.stream(...), then finalResponse()
//   once           client.responses.create() without streaming
//   tools-helper   the stream helper with one function tool
//   previous       create-stream with previous_response_id
// Prints one JSON object: what the SDK yielded, returned or raised.
const OpenAI = require("openai");

const [baseURL, model, mode, previous] = process.argv.slice(2);
// No SDK retries: the gateway's own attempts are what is measured.
const client = new OpenAI({ baseURL, apiKey: "client-key", maxRetries: 0, timeout: 20000 });
const TOOLS = [{
  type: "function",
  name: "get_weather",
  description: "The weather in a city.",
  parameters: { type: "object", properties: { q: { type: "string" } } },
}];
// What agents send beside the public schema: never a reason to refuse.
const EXTRA = {
  store: false,
  include: ["reasoning.encrypted_content"],
  prompt_cache_key: "agent-session-1",
  client_metadata: { agent: "e2e" },
};

function errorOf(e) {
  if (e instanceof OpenAI.APIError) {
    return { class: e.constructor.name, status: e.status ?? null, message: e.message, code: e.code ?? null };
  }
  return { class: e && e.constructor ? e.constructor.name : "Error", status: null, message: String(e && e.message), code: null };
}

function usageOf(usage) {
  return usage ? { input_tokens: usage.input_tokens, output_tokens: usage.output_tokens } : null;
}

function finalOf(out, response) {
  out.id = response.id;
  out.status = response.status;
  out.model = response.model;
  out.text = response.output_text;
  out.usage = usageOf(response.usage);
  out.calls = (response.output || [])
    .filter((item) => item.type === "function_call")
    .map((item) => ({ call_id: item.call_id, name: item.name, arguments: item.arguments }));
}

function seen(out, event) {
  out.events.push(event.type);
  out.sequence.push(event.sequence_number);
  if (event.type === "response.created") out.ids.push(event.response.id);
  else if (event.type === "response.output_text.delta") out.deltas.push(event.delta);
  else if (event.type === "response.function_call_arguments.delta") out.argument_deltas += 1;
  else if (["response.completed", "response.failed", "response.incomplete"].includes(event.type)) {
    out.status = event.response.status;
    out.usage = usageOf(event.response.usage);
  }
}

async function run() {
  const out = { ok: false, events: [], sequence: [], ids: [], deltas: [], argument_deltas: 0, text: "", calls: [] };
  const args = { model, input: "Tell me about caching.", ...EXTRA };
  if (mode === "tools-helper") {
    args.tools = TOOLS;
    args.parallel_tool_calls = true;
  }
  if (mode === "previous") args.previous_response_id = previous;
  try {
    if (mode === "create-stream" || mode === "previous") {
      const stream = await client.responses.create({ ...args, stream: true });
      for await (const event of stream) seen(out, event);
      out.text = out.deltas.join("");
    } else if (mode === "helper" || mode === "tools-helper") {
      const stream = client.responses.stream(args);
      for await (const event of stream) seen(out, event);
      finalOf(out, await stream.finalResponse());
    } else if (mode === "once") {
      finalOf(out, await client.responses.create(args));
    } else {
      throw new Error(`unknown mode ${mode}`);
    }
    out.ok = true;
  } catch (e) {
    out.error = errorOf(e);
  }
  return out;
}

run().then((out) => console.log(JSON.stringify(out)));
