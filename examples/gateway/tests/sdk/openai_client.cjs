// Drives the gateway with the official `openai` npm package.
// Usage: node openai_client.cjs BASE_URL MODEL stream|once  (NODE_PATH finds openai)
// Prints one JSON object: what the SDK returned or raised.
const OpenAI = require("openai");

async function main() {
  const [baseURL, model, mode] = process.argv.slice(2);
  // No SDK retries: the gateway's own attempts are what is measured.
  const client = new OpenAI({ baseURL, apiKey: "client-key", maxRetries: 0, timeout: 20000 });
  const messages = [{ role: "user", content: "Tell me about caching." }];
  const out = { text: "", chunks: 0, ok: false };
  try {
    if (mode === "stream") {
      const stream = await client.chat.completions.create({ model, messages, stream: true });
      for await (const chunk of stream) {
        out.chunks += 1;
        out.model = chunk.model;
        for (const choice of chunk.choices) {
          if (choice.delta && choice.delta.content) out.text += choice.delta.content;
          if (choice.finish_reason) out.finish_reason = choice.finish_reason;
        }
      }
    } else {
      const completion = await client.chat.completions.create({ model, messages });
      out.text = completion.choices[0].message.content;
      out.model = completion.model;
      out.finish_reason = completion.choices[0].finish_reason;
    }
    out.ok = true;
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    out.error = {
      class: e.constructor.name,
      status: e.status ?? null,
      message: e.message,
      code: e.code ?? null,
      type: e.type ?? null,
    };
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
