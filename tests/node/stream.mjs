// One streamed chat completion through the openai SDK for Node, as a caller that runs none of graceful's code.
//   node stream.mjs BASE_URL MODEL MAX_TOKENS [API_KEY]
// Prints one JSON line per chunk, then {"end": ...} with the text, the finish reasons, the usage and the ids seen,
// or {"error": ...} if the SDK raised. Exits 0 either way; the test judges the lines.
import OpenAI from "openai";

const [baseURL, model, maxTokens, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: apiKey || "unused", maxRetries: 0, timeout: 120000 });
let text = "";
const finishes = [];
const ids = new Set();
let usage = null;
try {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Count for me please" }],
    max_tokens: Number(maxTokens),
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    ids.add(chunk.id);
    for (const choice of chunk.choices ?? []) {
      text += choice.delta?.content ?? "";
      if (choice.finish_reason) finishes.push(choice.finish_reason);
    }
    if (chunk.usage) usage = chunk.usage;
    console.log(JSON.stringify({ chunk: chunk.choices?.[0]?.delta?.content ?? null }));
  }
  console.log(JSON.stringify({ end: { text, finishes, usage, ids: [...ids] } }));
} catch (error) {
  console.log(JSON.stringify({ error: String(error), text }));
}
