// Drives a gateway route that may translate, with the official `openai` npm package.
// Usage: node translate_openai.cjs BASE_URL MODEL MODE [MODEL2]  (NODE_PATH finds openai)
// MODE: stream | once | tools-stream | tools-once | agent | n2
//   stream, once       a text answer (streamed or not)
//   tools-stream/once  a request with one function tool; the tool calls
//   agent              turn 1 on MODEL with the tool (streamed), turn 2 on
//                      MODEL2: the history, the tool call's result (role
//                      tool) and the tool again (not streamed)
//   n2                 n=2, not streamed
// Prints one JSON object: what the SDK returned or raised.
const OpenAI = require("openai");

const QUESTION = [{ role: "user", content: "Tell me about caching." }];
const TOOLS = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city.",
    parameters: { type: "object", properties: { q: { type: "string" } } },
  },
}];
const USAGE = { include_usage: true };

function usageOf(usage) {
  if (!usage) return null;
  return {
    prompt_tokens: usage.prompt_tokens,
    completion_tokens: usage.completion_tokens,
    total_tokens: usage.total_tokens,
  };
}

function callsOf(toolCalls) {
  return (toolCalls || []).map((call) => {
    const text = call.function.arguments;
    let args = null;
    try {
      args = JSON.parse(text);
    } catch (_) {
      args = null;
    }
    return { id: call.id, type: call.type, name: call.function.name, arguments: args, arguments_text: text };
  });
}

function errorOf(e) {
  if (e instanceof OpenAI.APIError) {
    return {
      class: e.constructor.name,
      status: e.status ?? null,
      message: e.message,
      code: e.code ?? null,
      type: e.type ?? null,
    };
  }
  return { class: e && e.constructor ? e.constructor.name : "Error", status: null, message: String(e && e.message), code: null, type: null };
}

function completionOf(out, completion) {
  out.id = completion.id;
  out.ids = [completion.id];
  out.object = completion.object;
  out.model = completion.model;
  out.choices = completion.choices.length;
  const choice = completion.choices[0];
  out.text = choice.message.content || "";
  out.content = choice.message.content ?? null;
  out.finish_reason = choice.finish_reason;
  out.tool_calls = callsOf(choice.message.tool_calls);
  out.usage = usageOf(completion.usage);
}

function noteChunk(out, chunk) {
  out.chunks += 1;
  if (!out.ids.includes(chunk.id)) out.ids.push(chunk.id);
  out.id = out.ids[0];
  out.object = chunk.object;
  out.model = chunk.model;
  if (chunk.usage) out.usage = usageOf(chunk.usage);
}

// A raw stream: every chunk's id, the text as it came.
async function textStream(client, out, args) {
  out.deltas = 0;
  const stream = await client.chat.completions.create({ ...args, stream: true, stream_options: USAGE });
  for await (const chunk of stream) {
    noteChunk(out, chunk);
    for (const choice of chunk.choices) {
      if (choice.delta && choice.delta.content) {
        out.deltas += 1;
        out.text += choice.delta.content;
      }
      if (choice.finish_reason) out.finish_reason = choice.finish_reason;
    }
  }
}

// The SDK's stream helper: it joins the tool calls' argument pieces.
async function toolsStream(client, out, args) {
  const stream = client.chat.completions.stream({ ...args, stream_options: USAGE });
  for await (const chunk of stream) {
    noteChunk(out, chunk);
    for (const choice of chunk.choices) {
      if (choice.delta && choice.delta.content) out.text += choice.delta.content;
      if (choice.delta && choice.delta.tool_calls) out.argument_deltas = (out.argument_deltas || 0) + 1;
    }
  }
  const ids = out.ids;
  completionOf(out, await stream.finalChatCompletion());
  out.ids = ids;
}

async function turn(client, model, messages, stream, tools, n) {
  const out = { text: "", chunks: 0, ids: [], tool_calls: [], ok: false };
  const args = { model, messages };
  if (tools) args.tools = TOOLS;
  if (n !== undefined) args.n = n;
  try {
    if (stream && tools) await toolsStream(client, out, args);
    else if (stream) await textStream(client, out, args);
    else completionOf(out, await client.chat.completions.create(args));
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
  const client = new OpenAI({ baseURL, apiKey: "client-key", maxRetries: 0, timeout: 20000 });
  let out;
  if (mode === "stream" || mode === "once") {
    out = await turn(client, model, QUESTION, mode === "stream", false);
  } else if (mode === "tools-stream" || mode === "tools-once") {
    out = await turn(client, model, QUESTION, mode === "tools-stream", true);
  } else if (mode === "n2") {
    out = await turn(client, model, QUESTION, false, false, 2);
  } else if (mode === "agent") {
    const first = await turn(client, model, QUESTION, true, true);
    out = { turn1: first, ok: false };
    if (first.ok && first.tool_calls.length > 0) {
      const call = first.tool_calls[0];
      const history = [
        ...QUESTION,
        {
          role: "assistant",
          content: null,
          tool_calls: [{
            id: call.id,
            type: "function",
            function: { name: call.name, arguments: call.arguments_text },
          }],
        },
        { role: "tool", tool_call_id: call.id, content: "Sunny, 21 degrees." },
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
