#!/usr/bin/env python3
"""Ranks a corpus's tokens by frequency and writes the most frequent as a
draft vocabulary (the drafter's draft_vocab setting): an MTP head then drafts
from those tokens only, and a draft step's LM head reads their rows alone.

The corpus is tokenized by `tandem tokenize` with the model's tokenizer.json,
so the ids are the ones the services see. Text files, or folders searched for
files with the given suffixes; the output lists one id a line, most frequent
first, after a header saying how much of the corpus the list covers.

usage: draft_vocab.py --tokenizer FILE --size N [--tandem PATH]
                      [--suffix .py,.txt,.md] [--out FILE] CORPUS...
"""
import argparse
import collections
import os
import subprocess
import sys


def files_of(paths, suffixes):
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                for n in sorted(names):
                    if n.endswith(suffixes):
                        yield os.path.join(root, n)
        else:
            yield p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="the model's tokenizer.json")
    ap.add_argument("--size", type=int, required=True, help="tokens to keep")
    ap.add_argument("--tandem", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                     "services", "cli", "tandem"))
    ap.add_argument("--suffix", default=".py,.txt,.md,.rst",
                    help="file suffixes to read in folders (comma-separated)")
    ap.add_argument("--max-bytes", type=int, default=256 << 20, help="stop after this much text")
    ap.add_argument("--out", default="-")
    ap.add_argument("corpus", nargs="+")
    a = ap.parse_args()
    if a.size < 1:
        sys.exit("draft_vocab.py: --size must be at least 1")
    counts, nbytes, nfiles = collections.Counter(), 0, 0
    for path in files_of(a.corpus, tuple(a.suffix.split(","))):
        try:
            with open(path, "rb") as f:
                text = f.read()
            text.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # unreadable, or not UTF-8 text
        if not text.strip():
            continue
        r = subprocess.run([a.tandem, "tokenize", "--tokenizer", a.tokenizer, "-"], input=text,
                           capture_output=True, check=False)
        if r.returncode != 0:
            sys.exit("draft_vocab.py: tandem tokenize %s: %s" % (path, r.stderr.decode()))
        counts.update(int(t) for t in r.stdout.split())
        nbytes += len(text)
        nfiles += 1
        if nbytes >= a.max_bytes:
            break
    total = sum(counts.values())
    if total == 0:
        sys.exit("draft_vocab.py: no text in %s" % " ".join(a.corpus))
    top = counts.most_common(a.size)
    covered = sum(c for _, c in top)
    lines = ["# draft vocabulary: the %d most frequent of %d distinct tokens in %d files "
             "(%.1f MB, %d tokens) of %s" % (len(top), len(counts), nfiles, nbytes / 1e6, total,
                                              " ".join(a.corpus)),
             "# covers %.2f %% of the corpus's tokens; one id a line, most frequent first"
             % (100.0 * covered / total)]
    lines += [str(t) for t, _ in top]
    out = "\n".join(lines) + "\n"
    if a.out == "-":
        sys.stdout.write(out)
    else:
        with open(a.out, "w") as f:
            f.write(out)
    print("draft_vocab.py: %d tokens cover %.2f %% of %d corpus tokens" %
          (len(top), 100.0 * covered / total, total), file=sys.stderr)


if __name__ == "__main__":
    main()
