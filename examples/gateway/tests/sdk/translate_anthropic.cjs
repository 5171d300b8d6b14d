// Drives a gateway route that may translate, with the official `@anthropic-ai/sdk` npm package.
// Usage: node translate_anthropic.cjs BASE_URL MODEL MODE [MODEL2]  (NODE_PATH finds it)
// MODE: stream | once | tools-stream | tools-once | agent
//   stream, once       a text answer (streamed or not)
//   tools-stream/once  a request with one tool; the tool_use blocks
//   agent              turn 1 on MODEL with the tool (streamed), turn 2 on
//                      MODEL2: the history, a tool_result block and the
//                      tool again (not streamed)
// Prints one JSON object: what the SDK returned or raised.
const sdk = require("@anthropic-ai/sdk");
const Anthropic = sdk.Anthropic ?? sdk.default ?? sdk;
const APIError = sdk.APIError ?? Anthropic.APIError;

const QUESTION = [{ role: "user", content: "Tell me about caching." }];
const TOOLS = [{
  name: "get_weather",
  description: "The weather in a city.",
  input_schema: { type: "object", properties: { q: { type: "string" } } },
}];

function usageOf(usage) {
  if (!usage) return null;
  return { input_tokens: usage.input_tokens, output_tokens: usage.output_tokens };
}

function errorOf(e) {
  if (e instanceof APIError) {
    const body = e.error && typeof e.error === "object" ? e.error : {};
    const error = body.error && typeof body.error === "object" ? body.error : {};
    return { class: e.constructor.name, status: e.status ?? null, message: e.message, type: error.type ?? null };
  }
  return { class: e && e.constructor ? e.constructor.name : "Error", status: null, message: String(e && e.message), type: null };
}

function messageOf(out, message) {
  out.id = message.id;
  out.type = message.type;
  out.role = message.role;
  out.model = message.model;
  out.stop_reason = message.stop_reason;
  out.usage = usageOf(message.usage);
  out.blocks = message.content.map((b) => b.type);
  out.text = message.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  out.tool_calls = message.content
    .filter((b) => b.type === "tool_use")
    .map((b) => ({ id: b.id, name: b.name, arguments: b.input }));
  // Sent back as it came, as an agent loop does.
  out.content = message.content;
}

// The raw events: the text as it came, usage as the events carried it.
async function textStream(client, out, args) {
  out.deltas = 0;
  const usage = {};
  const stream = await client.messages.create({ ...args, stream: true });
  for await (const event of stream) {
    out.events += 1;
    if (event.type === "message_start") {
      out.id = event.message.id;
      out.model = event.message.model;
      usage.input_tokens = event.message.usage.input_tokens;
      usage.output_tokens = event.message.usage.output_tokens;
    } else if (event.type === "content_block_delta" && event.delta.type === "text_delta") {
      out.deltas += 1;
      out.text += event.delta.text;
    } else if (event.type === "message_delta") {
      out.stop_reason = event.delta.stop_reason;
      usage.output_tokens = event.usage.output_tokens;
      if (event.usage.input_tokens != null) usage.input_tokens = event.usage.input_tokens;
    } else if (event.type === "message_stop") {
      out.stopped = true;
    }
  }
  out.usage = usage;
}

// The SDK's stream helper: it joins the input_json_delta pieces.
async function toolsStream(client, out, args) {
  const stream = client.messages.stream(args);
  for await (const event of stream) {
    out.events += 1;
    if (event.type === "content_block_delta") {
      if (event.delta.type === "text_delta") out.text += event.delta.text;
      else if (event.delta.type === "input_json_delta") out.argument_deltas = (out.argument_deltas || 0) + 1;
    }
  }
  messageOf(out, await stream.finalMessage());
}

async function turn(client, model, messages, stream, tools) {
  const out = { text: "", events: 0, tool_calls: [], ok: false };
  const args = { model, max_tokens: 256, messages };
  if (tools) args.tools = TOOLS;
  try {
    if (stream && tools) await toolsStream(client, out, args);
    else if (stream) await textStream(client, out, args);
    else messageOf(out, await client.messages.create(args));
    out.ok = true;
  } catch (e) {
    out.error = errorOf(e);
  }
  return out;
}

async function main() {
  const [baseURL, model, mode, model2Arg] = process.argv.slice(2);
  const model2 = model2Arg || model;
  // No SDK retries: the gateway's own attempts are what is measured.
  const client = new Anthropic({ baseURL, apiKey: "client-key", maxRetries: 0, timeout: 20000 });
  let out;
  if (mode === "stream" || mode === "once") {
    out = await turn(client, model, QUESTION, mode === "stream", false);
  } else if (mode === "tools-stream" || mode === "tools-once") {
    out = await turn(client, model, QUESTION, mode === "tools-stream", true);
  } else if (mode === "agent") {
    const first = await turn(client, model, QUESTION, true, true);
    out = { turn1: first, ok: false };
    if (first.ok && first.tool_calls.length > 0) {
      const call = first.tool_calls[0];
      const history = [
        ...QUESTION,
        { role: "assistant", content: first.content },
        {
          role: "user",
          content: [{ type: "tool_result", tool_use_id: call.id, content: "Sunny, 21 degrees." }],
        },
      ];
      const second = await turn(client, model2, history, false, true);
      out.turn2 = second;
      out.ok = second.ok;
    }
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
