// Drives POST /v1/responses with the official Node SDK (`openai`) or the
// Vercel AI SDK's default OpenAI provider (`openai(model)`), as a user's
// code would, and prints what came back as one JSON line.
//   RELAY_BASE=http://127.0.0.1:PORT RELAY_KEY=sk-... MODEL=m CLIENT=openai|vercel node responses_check.mjs
import OpenAI from "openai";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const { RELAY_BASE: base, RELAY_KEY: apiKey, MODEL: model, CLIENT: which } = process.env;
const weather = {
  type: "function", name: "get_weather", description: "Weather for a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};

async function official() {
  const client = new OpenAI({ apiKey, baseURL: `${base}/v1`, maxRetries: 0 });
  const out = {};
  const r = await client.responses.create({ model, input: "Hello", instructions: "Be brief." });
  out.create = { id: r.id, text: r.output_text, status: r.status, usage: r.usage };
  const stream = client.responses.stream({ model, input: "Weather in Paris?", tools: [weather] });
  const types = [];
  for await (const event of stream) types.push(event.type);
  const final = await stream.finalResponse();
  const calls = final.output.filter((o) => o.type === "function_call");
  out.stream = { types, calls: calls.map((c) => ({ name: c.name, arguments: c.arguments })) };
  const r2 = await client.responses.create({
    model, tools: [weather], tool_choice: "none", input: [
      { role: "user", content: "Weather in Paris?" },
      { type: "function_call", call_id: calls[0].call_id, name: calls[0].name,
        arguments: calls[0].arguments },
      { type: "function_call_output", call_id: calls[0].call_id, output: "Sunny, 21C" }],
  });
  out.second = { text: r2.output_text };
  return out;
}

async function vercel() {
  const openai = createOpenAI({ apiKey, baseURL: `${base}/v1` });
  const tools = {
    get_weather: tool({
      description: "Weather for a city",
      inputSchema: jsonSchema({ type: "object", properties: { city: { type: "string" } },
                                required: ["city"] }),
      execute: async ({ city }) => `Sunny in ${city}`,
    }),
  };
  const r = await generateText({ model: openai(model), prompt: "Weather in Paris?", tools,
                                 stopWhen: stepCountIs(3) });
  const s = streamText({ model: openai(model), prompt: "Hello" });
  let streamed = "";
  for await (const delta of s.textStream) streamed += delta;
  return { text: r.text, steps: r.steps.length, usage: r.totalUsage, streamed,
           toolCalls: r.steps.flatMap((st) => st.toolCalls.map((c) => c.toolName)) };
}

try {
  const out = which === "vercel" ? await vercel() : await official();
  console.log(JSON.stringify({ ok: true, ...out }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err?.stack || err) }));
  process.exitCode = 1;
}
