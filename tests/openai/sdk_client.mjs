// The official openai npm SDK against tandem-gateway's OpenAI-compatible API:
// non-streaming and streaming completions and chat completions, greedy.
// Prints one JSON object with what it got.
//   node sdk_client.mjs BASE_URL MODEL PROMPT MAX_TOKENS
import OpenAI from "openai";

const [baseURL, model, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const n = Number(maxTokens);
const out = {};

const c = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0 });
out.completion = { text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage,
                   object: c.object, tandem: c.tandem };

let text = "", finish = null, usage = null, chunks = 0;
const s = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0,
                                            stream: true, stream_options: { include_usage: true } });
for await (const ch of s) {
  chunks++;
  if (ch.choices.length) {
    text += ch.choices[0].text;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  if (ch.usage) usage = ch.usage;
}
out.completion_stream = { text, finish, usage, chunks };

const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: prompt }];
// ignore_eos (an extension): the demo model ends a chat turn at once.
const cc = await client.chat.completions.create({ model, messages, max_tokens: n, temperature: 0,
                                                  ignore_eos: true });
out.chat = { text: cc.choices[0].message.content, role: cc.choices[0].message.role,
             finish: cc.choices[0].finish_reason, usage: cc.usage, object: cc.object };

text = ""; finish = null; let role = null;
const cs = await client.chat.completions.create({ model, messages, max_tokens: n, temperature: 0,
                                                  ignore_eos: true, stream: true });
for await (const ch of cs) {
  const d = ch.choices[0].delta;
  if (d.role) role = d.role;
  if (d.content) text += d.content;
  if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
}
out.chat_stream = { text, finish, role };

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

try {
  await client.completions.create({ model: "no-such-model", prompt, max_tokens: 1 });
  out.unknown_model = "accepted";
} catch (e) {
  out.unknown_model = { status: e.status, code: e.code, param: e.param };
}
console.log(JSON.stringify(out));
