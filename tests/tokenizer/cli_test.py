#!/usr/bin/env python3
"""tokenizer_cli: `tandem tokenize` / `tandem detokenize` against the HF fixtures.

usage: cli_test.py TANDEM_BINARY FIXTURE_DIR

Feeds a sample of the reference corpus through the CLI (text on stdin and as
an argument) and compares with the ids and text HF produced; checks that bad
input exits non-zero with a message.
"""
import json
import subprocess
import sys


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, timeout=60)


def main():
    tandem, fx = sys.argv[1], sys.argv[2]
    corpus = [json.loads(l)["text"] for l in open(f"{fx}/corpus.jsonl", encoding="utf-8")]
    failures = 0
    for name in ("qwen2_bpe1000",):
        tok = f"{fx}/{name}.tokenizer.json"
        expected = [json.loads(l) for l in open(f"{fx}/{name}.expected.jsonl", encoding="utf-8")]
        for i in range(0, len(corpus), 397):
            text, exp = corpus[i], expected[i]
            r = run([tandem, "tokenize", "--tokenizer", tok, "-"], stdin=text.encode("utf-8"))
            ids = [int(x) for x in r.stdout.split()]
            if r.returncode != 0 or ids != exp["ids"]:
                print(f"{name} line {i + 1}: tokenize gave {ids[:20]}..., HF {exp['ids'][:20]}...",
                      r.stderr.decode(errors="replace"), file=sys.stderr)
                failures += 1
                continue
            if text and "\0" not in text and not text.startswith("-"):
                r2 = run([tandem, "tokenize", "--tokenizer", tok, text])
                if [int(x) for x in r2.stdout.split()] != exp["ids"]:
                    print(f"{name} line {i + 1}: text as argument differs", file=sys.stderr)
                    failures += 1
            d = run([tandem, "detokenize", "--tokenizer", tok] + [str(x) for x in exp["ids"]])
            want = exp.get("decoded", text)
            if d.returncode != 0 or d.stdout.decode("utf-8") != want:
                print(f"{name} line {i + 1}: detokenize gave {d.stdout[:80]!r}, HF {want[:80]!r}",
                      file=sys.stderr)
                failures += 1
            d = run([tandem, "detokenize", "--tokenizer", tok, "--skip-special"],
                    stdin=json.dumps(exp["ids"]).encode())
            if d.stdout.decode("utf-8") != exp.get("decoded_skip", want):
                print(f"{name} line {i + 1}: detokenize --skip-special differs", file=sys.stderr)
                failures += 1
    tok = f"{fx}/qwen2_bpe1000.tokenizer.json"
    # "--" ends options: a text that starts with a dash is text, not an option.
    for text in ("-x --tokens", "--help me"):
        a = run([tandem, "tokenize", "--tokenizer", tok, "--", text])
        b = run([tandem, "tokenize", "--tokenizer", tok, "-"], stdin=text.encode())
        if a.returncode != 0 or a.stdout != b.stdout or not a.stdout.strip():
            print(f"tokenize -- {text!r}: {a.returncode} {a.stdout!r} {a.stderr!r}, "
                  f"stdin gave {b.stdout!r}", file=sys.stderr)
            failures += 1
    ids = run([tandem, "tokenize", "--tokenizer", tok, "--", "-x"]).stdout.split()
    d = run([tandem, "detokenize", "--tokenizer", tok, "--"] + [x.decode() for x in ids])
    if d.returncode != 0 or d.stdout != b"-x":
        print(f"detokenize -- {ids}: {d.returncode} {d.stdout!r} {d.stderr!r}", file=sys.stderr)
        failures += 1
    bad = [
        ([tandem, "tokenize", "--tokenizer", tok, "-"], b"ok\xff", b"byte offset 2"),
        ([tandem, "tokenize", "--tokenizer", f"{fx}/missing.json", "x"], None, b"missing.json"),
        ([tandem, "tokenize", "x"], None, b"--tokenizer"),
        ([tandem, "detokenize", "--tokenizer", tok, "1", "123456789"], None, b"out of range"),
        ([tandem, "detokenize", "--tokenizer", tok, "12abc"], None, b"12abc"),
    ]
    for args, stdin, needle in bad:
        r = run(args, stdin)
        if r.returncode == 0 or needle not in r.stderr:
            print(f"{args[1:]}: rc {r.returncode}, stderr {r.stderr!r} lacks {needle!r}",
                  file=sys.stderr)
            failures += 1
    r = run([tandem, "tokenize", "--tokenizer", tok, "--chat", "user=hi"])
    r2 = run([tandem, "tokenize", "--tokenizer", tok, "-"],
             stdin=b"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    if r.returncode != 0 or r.stdout != r2.stdout:
        print("--chat differs from the ChatML text", file=sys.stderr)
        failures += 1
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
