// One streamed Responses answer through the openai SDK for Node, as a caller that runs none of graceful's code.
//   node responses.mjs BASE_URL MODEL MAX_OUTPUT_TOKENS API_KEY HOW [EXTRA]
// HOW is "create" (responses.create({stream: true})) or "stream" (the responses.stream() helper, which
// assembles the response from the events and checks them as it goes); EXTRA, a JSON object of fields the
// request adds (sampling, LiteLLM's extra_body).
// Prints one JSON line per event (its type, and a delta's text), then {"end": ...} with the ids, the sequence numbers, the text of the deltas
// and the final response (the event that carried it, response.completed or response.incomplete, and its id,
// status, output text and usage), or {"error": ...} if the SDK raised or the stream ended without one. Exits 0 either way; the test judges the lines.
import OpenAI from "openai";

const [baseURL, model, maxTokens, apiKey, how, extra] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: apiKey || "unused", maxRetries: 0, timeout: 120000 });
const request = { model, input: "Count for me please", max_output_tokens: Number(maxTokens), ...JSON.parse(extra || "{}") };
const ids = new Set();
const sequence = [];
let text = "";
let completed = null;
try {
  const events = how === "stream" ? client.responses.stream(request) : await client.responses.create({ ...request, stream: true });
  for await (const event of events) {
    sequence.push(event.sequence_number);
    if (event.response?.id) ids.add(event.response.id);
    if (event.type === "response.output_text.delta") text += event.delta;
    if (event.type === "response.completed" || event.type === "response.incomplete") completed = { event: event.type, ...event.response };
    if (event.type === "response.failed" || event.type === "error") {
      throw new Error(`${event.type}: ${JSON.stringify(event.response?.error ?? event)}`);
    }
    console.log(JSON.stringify({ event: event.type, delta: event.type === "response.output_text.delta" ? event.delta : undefined }));
  }
  if (!completed) throw new Error("the stream ended without response.completed or response.incomplete");
  const final = how === "stream" ? { event: completed.event, ...(await events.finalResponse()) } : completed;
  const whole = final.output_text ?? final.output.map((item) => item.content.map((part) => part.text).join("")).join("");
  console.log(JSON.stringify({ end: { ids: [...ids], sequence, text, final: { event: final.event, id: final.id, status: final.status, text: whole, usage: final.usage } } }));
} catch (error) {
  console.log(JSON.stringify({ error: String(error), text }));
}
