// Drives the gateway's /v1/messages with the official `@anthropic-ai/sdk` npm package.
// Usage: node anthropic_client.cjs BASE_URL MODEL stream|once [tools]  (NODE_PATH finds it)
// Prints one JSON object: what the SDK returned or raised.
const sdk = require("@anthropic-ai/sdk");
const Anthropic = sdk.Anthropic ?? sdk.default ?? sdk;
const APIError = sdk.APIError ?? Anthropic.APIError;

async function main() {
  const [baseURL, model, mode, extra] = process.argv.slice(2);
  // No SDK retries: the gateway's own attempts are what is measured.
  const client = new Anthropic({ baseURL, apiKey: "client-key", maxRetries: 0, timeout: 20000 });
  const args = {
    model,
    max_tokens: 256,
    messages: [{ role: "user", content: "Tell me about caching." }],
  };
  if (extra === "tools") {
    args.tools = [{
      name: "get_weather",
      description: "The weather in a city.",
      input_schema: { type: "object", properties: { q: { type: "string" } } },
    }];
  }
  const out = { text: "", partial_json: "", deltas: 0, tool_calls: 0, ok: false };
  try {
    if (mode === "stream") {
      const stream = await client.messages.create({ ...args, stream: true });
      for await (const event of stream) {
        if (event.type === "message_start") {
          out.model = event.message.model;
        } else if (event.type === "content_block_start") {
          if (event.content_block.type === "tool_use") out.tool_calls += 1;
        } else if (event.type === "content_block_delta") {
          out.deltas += 1;
          if (event.delta.type === "text_delta") out.text += event.delta.text;
          else if (event.delta.type === "input_json_delta") out.partial_json += event.delta.partial_json;
        } else if (event.type === "message_delta") {
          out.stop_reason = event.delta.stop_reason;
          out.output_tokens = event.usage.output_tokens;
        }
      }
    } else {
      const message = await client.messages.create(args);
      out.model = message.model;
      out.stop_reason = message.stop_reason;
      for (const block of message.content) {
        if (block.type === "text") out.text += block.text;
        else if (block.type === "tool_use") out.tool_calls += 1;
      }
    }
    out.ok = true;
  } catch (e) {
    if (!(e instanceof APIError)) throw e;
    const body = e.error && typeof e.error === "object" ? e.error : {};
    const error = body.error && typeof body.error === "object" ? body.error : {};
    out.error = {
      class: e.constructor.name,
      status: e.status ?? null,
      message: e.message,
      type: error.type ?? null,
      phase: error.phase ?? null,
      bytes_sent: error.bytes_sent ?? null,
      output_events: error.output_events ?? null,
    };
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
