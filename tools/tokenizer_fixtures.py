#!/usr/bin/env python3
"""Reference fixtures for tandem's tokenizer (tokenizer/tokenizer.h).

Runs where Hugging Face `tokenizers` is installed (the GPU machine). It

  1. builds a deterministic test corpus (fixed seed) of >= 2,000 varied strings:
     source code, prose in many scripts, and the edge cases byte-level BPE gets
     wrong most often (whitespace runs, CRLF, tabs, long numbers, emoji ZWJ
     sequences and skin tones, combining marks, special tokens inside text,
     very long words, odd-case contractions, Unicode whitespace);
  2. trains byte-level BPE tokenizers with the Qwen pre-tokenizer
     configuration (NFC, Split(Regex) isolated + ByteLevel without regex,
     ByteLevel decoder) and a GPT-2 style one (ByteLevel with its own regex);
  3. adds every models/*/tokenizer.json of the checkout, when there are any;
  4. encodes the corpus with each tokenizer and records ids and decoded text;
  5. times HF's encode over the corpus (single-threaded loop, and one large
     document) for bench/RESULTS.md.

Output (in --out): fixtures.tar.gz holding
  corpus.jsonl                  {"text": ...} per line
  <name>.tokenizer.json         the tokenizer as HF serialises it
  <name>.expected.jsonl         {"ids": [...], "decoded": ..., "decoded_skip": ...}
                                per corpus line; "decoded" is omitted when it
                                equals the text, "decoded_skip" when it equals
                                "decoded"
  manifest.json                 names, versions, settings
and hf_timing.json beside it.

The corpus part needs only the standard library: `--corpus-only` writes
corpus.jsonl without importing `tokenizers` (to check the script anywhere).
"""
import argparse
import glob
import io
import json
import os
import platform
import random
import sys
import tarfile
import time

SEED = 20261130

# Qwen2 / Qwen3 tokenizer.json Split pattern.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The variant that keeps combining marks with their letters (\p{M}).
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                  r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ---------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------

PROSE = {
    "en": ["The quick brown fox jumps over the lazy dog.",
           "Speculative decoding lets a small model draft tokens that a large one verifies.",
           "She said, \"I can't believe it's already 3:45 p.m.!\"",
           "In 1969, Apollo 11 landed on the Moon; 600,000,000 people watched.",
           "We'll meet at Joe's place — don't be late, y'all."],
    "fr": ["Le cœur a ses raisons que la raison ne connaît point.",
           "Où est la bibliothèque ? Elle est fermée à cause de l'été.",
           "Ça va très bien, merci ; et vous-même ?"],
    "de": ["Größere Übungen erfordern Geduld und Fleiß.",
           "Die Straße führt über den Fluss nach Köln.",
           "Donaudampfschifffahrtsgesellschaftskapitänsmütze"],
    "es": ["¿Dónde está el niño? ¡Está en el jardín!", "El pingüino comió ñoquis con acción."],
    "pl": ["Zażółć gęślą jaźń.", "Pchnąć w tę łódź jeża lub ośm skrzyń fig."],
    "vi": ["Tiếng Việt có nhiều dấu thanh điệu.", "Người ta thường nói: học, học nữa, học mãi."],
    "ru": ["Съешь же ещё этих мягких французских булок, да выпей чаю.",
           "Москва — столица России. В 2024 году население превысило 13 млн."],
    "uk": ["Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!"],
    "el": ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "Η γλώσσα μου έδωσαν ελληνική."],
    "ar": ["نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق.",
           "اللغة العربية جميلة جداً ١٢٣٤٥٦٧٨٩٠"],
    "he": ["דג סקרן שט בים מאוכזב ולפתע מצא חברה.", "שָׁלוֹם עֲלֵיכֶם"],
    "hi": ["ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।",
           "हिन्दी में १२३ अंक हैं।"],
    "th": ["เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ"],
    "zh": ["我能吞下玻璃而不伤身体。", "敏捷的棕色狐狸跳过了懒狗。人工智能正在改变世界。",
           "推测解码：小模型起草，大模型验证，共计１２３个词元。"],
    "ja": ["いろはにほへと　ちりぬるを", "私はガラスを食べられます。それは私を傷つけません。",
           "ｶﾀｶﾅ ﾊﾝｶｸ と　全角スペース"],
    "ko": ["다람쥐 헌 쳇바퀴에 타고파", "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요."],
    "tr": ["Pijamalı hasta yağız şoföre çabucak güvendi.", "İstanbul'da ılık bir gün."],
    "ka": ["ქართული ენა ძალიან ლამაზია."],
    "am": ["ሰማይ አይታረስ ንጉሥ አይከሰስ።"],
    "ta": ["யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்"],
    "bn": ["আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না।"],
}

SCRIPT_RANGES = {
    "latin-ext": (0x00C0, 0x024F), "greek": (0x0391, 0x03C9), "cyrillic": (0x0410, 0x044F),
    "armenian": (0x0531, 0x0556), "hebrew": (0x05D0, 0x05EA), "arabic": (0x0621, 0x064A),
    "devanagari": (0x0905, 0x0939), "thai": (0x0E01, 0x0E2E), "hangul": (0xAC00, 0xD7A3),
    "cjk": (0x4E00, 0x9FFF), "hiragana": (0x3041, 0x3096), "katakana": (0x30A1, 0x30FA),
    "math": (0x2200, 0x22FF), "arrows": (0x2190, 0x21FF), "box": (0x2500, 0x257F),
    "cjk-ext-b": (0x20000, 0x2A6DF), "fullwidth": (0xFF01, 0xFF5E),
}

EMOJI = ["😀", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🇯🇵", "🧑🏿‍🚀", "👋🏻", "🤷‍♀️",
         "1️⃣", "#️⃣", "🫠", "🐍", "🚀✨", "☕", "©️", "™"]

COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "u\u031b\u0300", "A\u030a",
             "\u1100\u1161\u11a8", "\u1112\u1161\u11ab", "c\u0327", "i\u0307\u0301",
             "\u0915\u094d\u0937", "z\u0336", "x\u20dd", "\u0301leading", "a\u0300\u0301\u0302\u0303"]

UNICODE_SPACES = ["\u00a0", "\u2002", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f",
                  "\u3000", "\u1680", "\u0085", "\u2028", "\u2029", "\u180e", "\u200b",
                  "\ufeff", "\u000b", "\u000c"]

CONTRACTIONS = ["DON'T", "don't", "Don'T", "I'M", "i'm", "YOU'RE", "you'Re", "WE'VE", "THEY'LL",
                "he'D", "it'S", "O'Neil", "rock'n'roll", "'tis", "''", "can’t", "ſtop'ſ",
                "ǅemal's", "'S'T'RE"]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <stdio.h>\r\nint main(void)\r\n{\r\n    printf(\"hello, world\\n\");\r\n    return 0;\r\n}\r\n",
    "SELECT id, name FROM users WHERE created_at >= '2024-01-01' ORDER BY id DESC LIMIT 10;",
    "const f = async (x) => { await fetch(`/api/v1/items/${x}?q=1&r=2`); };",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "    \n\n\t\t  if x:\n\t\t\treturn None  # comment\n",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", vec![1u8; 4]); Ok(()) }",
    "<div class=\"x\">&nbsp;&lt;tag&gt;</div>",
    "x = 0x7fffffff; y = 1_000_000; z = 3.14159265358979323846;",
    "git commit -m 'fix: handle CRLF\\r\\n in tokenizer'",
    "$ ls -la /usr/local/bin | grep -E '^[-d]rwx' > out.txt 2>&1",
]

SPECIAL_SNIPPETS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "text before<|endoftext|>text after", "<|endoftext|><|endoftext|>", "<|im_end|>",
    "a<|im_start|>b", "<|im_start", "|im_end|>", "<|im_start|><|im_end|>", "<<|im_end|>>",
    "<think>\nreasoning here\n</think>\n\nanswer", "x <think> y </think> z", " <|endoftext|> ",
    "hello <mask> world", "hello<mask>world", "a   <mask>   b", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<tool_call><tool_call>", "\t<mask>\n",
    # NFC runs per piece between special tokens: a mark after one stays alone.
    "<|im_end|>\u0301a", "e<|endoftext|>\u0301", "\u1100<|im_start|>\u1161", "<think>\u0308x",
]


def repo_snippets(root, rng, count):
    """Chunks of the checkout's own text files (C, CMake, proto, Markdown)."""
    files = []
    for pat in ("**/*.c", "**/*.h", "**/*.txt", "**/*.proto", "**/*.md", "**/*.py", "**/*.sh"):
        files.extend(glob.glob(os.path.join(root, pat), recursive=True))
    files = sorted(f for f in set(files) if "/build" not in f and "/.git/" not in f)
    texts = []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        if t:
            texts.append(t)
    out = []
    if not texts:
        return out
    for _ in range(count):
        t = rng.choice(texts)
        a = rng.randrange(len(t))
        out.append(t[a:a + rng.randint(20, 600)])
    return out


def random_script_word(rng):
    name = rng.choice(sorted(SCRIPT_RANGES))
    lo, hi = SCRIPT_RANGES[name]
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12)))


def random_number(rng):
    k = rng.randrange(6)
    if k == 0:
        return str(rng.randint(0, 9))
    if k == 1:
        return str(rng.randint(0, 10 ** rng.randint(2, 40)))
    if k == 2:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if k == 3:
        return f"{rng.randint(1, 31):02d}/{rng.randint(1, 12):02d}/{rng.randint(1900, 2100)}"
    if k == 4:
        return "+1 (555) " + str(rng.randint(100, 999)) + "-" + str(rng.randint(1000, 9999))
    return "".join(chr(0x0660 + rng.randint(0, 9)) for _ in range(rng.randint(1, 8)))  # Arabic-Indic


def whitespace_run(rng):
    pool = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t \t", "    "] + UNICODE_SPACES
    return "".join(rng.choice(pool) for _ in range(rng.randint(1, 8)))


def fragment(rng):
    k = rng.randrange(11)
    if k == 0:
        return rng.choice(PROSE[rng.choice(sorted(PROSE))])
    if k == 1:
        return random_script_word(rng)
    if k == 2:
        return random_number(rng)
    if k == 3:
        return whitespace_run(rng)
    if k == 4:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if k == 5:
        return rng.choice(COMBINING)
    if k == 6:
        return rng.choice(CONTRACTIONS)
    if k == 7:
        return rng.choice(CODE)
    if k == 8:
        return rng.choice(SPECIAL_SNIPPETS)
    if k == 9:
        return "".join(chr(rng.randint(0x21, 0x7E)) for _ in range(rng.randint(1, 20)))
    return "".join(chr(rng.randint(0xA0, 0x2FFF)) for _ in range(rng.randint(1, 10)))


def valid_text(s):
    # Lone surrogates cannot be encoded as UTF-8; NUL would end a C string.
    return "".join(c for c in s if not (0xD800 <= ord(c) <= 0xDFFF) and c != "\0")


def build_corpus(root):
    rng = random.Random(SEED)
    corpus = []
    # Every fixed sample on its own, so each edge case appears at least once.
    for lang in sorted(PROSE):
        corpus.extend(PROSE[lang])
    corpus.extend(CODE)
    corpus.extend(SPECIAL_SNIPPETS)
    corpus.extend(EMOJI)
    corpus.extend(COMBINING)
    corpus.extend(CONTRACTIONS)
    corpus.extend(UNICODE_SPACES)
    corpus.extend(["x" + s + "y" for s in UNICODE_SPACES])
    corpus.extend(["a" + s + s + "b " + s for s in UNICODE_SPACES])
    corpus.extend(["", " ", "  ", "\n", "\r\n", "\r\n\r\n", "\t", "\t\t\n", " \t \n ", "a\r\nb\r\n",
                   "   leading", "trailing   ", "mid    dle", "new\n\n\nlines", "end\n", "\n\nstart",
                   "12345678901234567890", "3.14", "1,000,000", "v1.2.3", "0", "007", "1e-9",
                   "a" * 5000, "ab" * 1500, "🙂" * 300, "的" * 1000, " " * 1000, "\n" * 200,
                   "x\u0301" * 200, "supercalifragilisticexpialidocious" * 20, "-" * 300,
                   "Ⅻ ⅻ ½ ² ³ ① ⑳", "ﬁ ﬂ ﬃ", "Å Å Å", "한국어 한국어", "ℌℍ 𝔄𝔅 𝟘𝟙",
                   "\u00e9\u0065\u0301", "DON'T STOP", "I'D've", "'s", "'", "''''",
                   "x'S y'T z'RE", "\U0001F468\u200d\U0001F469\u200d\U0001F467"])
    corpus.extend(repo_snippets(root, rng, 400))
    while len(corpus) < 2400:
        n = rng.randint(1, 6)
        parts = [fragment(rng) for _ in range(n)]
        seps = ["", " ", "\n", "\t", "  ", "\r\n"]
        s = parts[0]
        for p in parts[1:]:
            s += rng.choice(seps) + p
        corpus.append(s)
    return [valid_text(s) for s in corpus]


def training_text(root, rng):
    """Python sources of installed packages plus generated multilingual text."""
    texts = []
    total = 0
    roots = sorted(set(p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)))
    files = []
    for r in roots:
        for pkg in ("tokenizers", "transformers", "numpy", "safetensors", "json", "email", "torch"):
            files.extend(glob.glob(os.path.join(r, pkg, "**", "*.py"), recursive=True))
    files.extend(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    for f in sorted(set(files)):
        if total > 8_000_000:
            break
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(t)
        total += len(t)
    for _ in range(30000):
        texts.append(" ".join(fragment(rng) for _ in range(rng.randint(1, 5))))
    for lang in sorted(PROSE):
        texts.extend(PROSE[lang] * 50)
    return [valid_text(t) for t in texts]


# ---------------------------------------------------------------------------
# Tokenizers (needs HF tokenizers)
# ---------------------------------------------------------------------------

def train_tokenizers(train):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)

    def qwen_like(pattern, vocab_size, ignore_merges, specials_in_trainer):
        tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=ignore_merges))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                  use_regex=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      special_tokens=SPECIALS if specials_in_trainer else [],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(train, trainer)
        return tok

    out = {}
    # Qwen2/Qwen3 layout: special tokens after the learned vocabulary, merges
    # written as "a b" strings (as Qwen's own files have them).
    t = qwen_like(QWEN2_PATTERN, 1000, False, False)
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    t.add_tokens([AddedToken("<think>", special=False, normalized=False),
                  AddedToken("</think>", special=False, normalized=False)])
    j = json.loads(t.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    s = json.dumps(j, ensure_ascii=False, indent=2)
    out["qwen2_bpe1000"] = (Tokenizer.from_str(s), s)

    # Qwen3.5-style pattern (\p{M}), ignore_merges, specials trained first,
    # extra added tokens with lstrip/rstrip and a normalized one.
    t = qwen_like(QWEN35_PATTERN, 8000, True, True)
    t.add_special_tokens([AddedToken("<mask>", special=True, normalized=False, lstrip=True,
                                     rstrip=True)])
    t.add_tokens([AddedToken("<think>", special=False, normalized=False),
                  AddedToken("</think>", special=False, normalized=False),
                  AddedToken("<tool_call>", special=False, normalized=True),
                  AddedToken("</tool_call>", special=False, normalized=True)])
    out["qwen35_bpe8000"] = (t, t.to_str())

    # GPT-2 style: no normalizer, ByteLevel with its own regex.
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                 use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train, trainer)
    out["gpt2_bpe2000"] = (tok, tok.to_str())
    return out


def model_tokenizers(root):
    from tokenizers import Tokenizer
    out = {}
    seen = set()
    for path in sorted(glob.glob(os.path.join(root, "models", "*", "tokenizer.json"))):
        name = "model_" + os.path.basename(os.path.dirname(path)).replace("-", "_").replace(".", "_")
        if os.path.getsize(path) > 4_000_000:
            print(f"skipping {path}: too large for a committed fixture", file=sys.stderr)
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                s = fh.read()
            if s in seen:  # models sharing one tokenizer need one fixture
                print(f"{path}: same tokenizer.json as an earlier model", file=sys.stderr)
                continue
            seen.add(s)
            out[name] = (Tokenizer.from_str(s), s)
        except Exception as e:  # report, keep going with the others
            print(f"skipping {path}: {e}", file=sys.stderr)
    return out


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def time_hf(tok, corpus):
    nbytes = sum(len(s.encode("utf-8")) for s in corpus)
    res = {}
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        for s in corpus:
            tok.encode(s)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    res["corpus_loop_MBps"] = nbytes / best / 1e6
    res["corpus_bytes"] = nbytes
    doc = "\n".join(corpus) * 8
    dbytes = len(doc.encode("utf-8"))
    best = None
    for _ in range(2):
        t0 = time.perf_counter()
        tok.encode(doc)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    res["big_doc_MBps"] = dbytes / best / 1e6
    res["big_doc_bytes"] = dbytes
    t0 = time.perf_counter()
    tok.encode_batch(corpus)
    res["corpus_encode_batch_parallel_MBps"] = nbytes / (time.perf_counter() - t0) / 1e6
    return res


def add_file(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--corpus-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    corpus = build_corpus(args.root)
    corpus_jsonl = "".join(json.dumps({"text": s}, ensure_ascii=False) + "\n" for s in corpus)
    print(f"corpus: {len(corpus)} strings, {sum(len(s.encode()) for s in corpus)} bytes")
    if args.corpus_only:
        with open(os.path.join(args.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
            f.write(corpus_jsonl)
        return

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import tokenizers
    t0 = time.time()
    toks = train_tokenizers(training_text(args.root, random.Random(SEED + 1)))
    print(f"trained {sorted(toks)} in {time.time() - t0:.1f}s")
    toks.update(model_tokenizers(args.root))

    manifest = {"tokenizers_version": tokenizers.__version__, "python": platform.python_version(),
                "seed": SEED, "corpus_strings": len(corpus), "tokenizers": sorted(toks)}
    timing = {"cpu": cpu_name(), "tokenizers_version": tokenizers.__version__, "results": {}}
    with tarfile.open(os.path.join(args.out, "fixtures.tar.gz"), "w:gz") as tar:
        add_file(tar, "corpus.jsonl", corpus_jsonl.encode("utf-8"))
        for name in sorted(toks):
            tok, tok_json = toks[name]
            add_file(tar, f"{name}.tokenizer.json", tok_json.encode("utf-8"))
            lines = []
            for enc, text in zip(tok.encode_batch(corpus), corpus):
                ids = enc.ids
                rec = {"ids": ids}
                dec = tok.decode(ids, skip_special_tokens=False)
                skip = tok.decode(ids, skip_special_tokens=True)
                if dec != text:
                    rec["decoded"] = dec
                if skip != dec:
                    rec["decoded_skip"] = skip
                lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
            # encode_batch and encode must agree; check a slice with encode.
            for text, line in list(zip(corpus, lines))[:200]:
                assert tok.encode(text).ids == json.loads(line)["ids"], text
            add_file(tar, f"{name}.expected.jsonl", "".join(lines).encode("utf-8"))
            timing["results"][name] = time_hf(tok, corpus)
            print(name, json.dumps(timing["results"][name]))
        add_file(tar, "manifest.json", json.dumps(manifest, indent=1).encode("utf-8"))
    with open(os.path.join(args.out, "hf_timing.json"), "w") as f:
        json.dump(timing, f, indent=1)
    print(json.dumps(timing, indent=1))


if __name__ == "__main__":
    main()
