#!/usr/bin/python3
"""Independent reference for the tokenizer and model fingerprints.

Implements, from the descriptions in tokenizer/tokenizer.h (tokenizer) and
service/compat.h (model) alone, the canonical hashes of a tokenizer.json and
of a model directory with Python's json,
struct and hashlib, and compares them with what the C code computes
(`compat_test tokenizer-fp FILE` / `compat_test model-fp DIR`) on the real
tokenizers and models in tests/fixtures (trained by Hugging Face tokenizers and
saved by transformers), and on reformatted copies (indentation, key order,
pair-form merges) that must hash the same.

usage: fingerprint_ref.py COMPAT_TEST_BINARY REPO_ROOT
"""
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tarfile
import tempfile


def item(h, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def canon(h, v, skip=()):
    if v is None:
        item(h, "n")
    elif isinstance(v, bool):
        item(h, "t" if v else "f")
    elif isinstance(v, (int, float)):
        f = float(v)
        if f == int(f) and -9e15 < f < 9e15:
            text = "%d" % int(f)
        else:
            text = "%.17g" % f
        item(h, "#")
        item(h, text)
    elif isinstance(v, str):
        item(h, "s")
        item(h, v)
    elif isinstance(v, list):
        item(h, "[")
        item(h, str(len(v)))
        for e in v:
            canon(h, e)
    elif isinstance(v, dict):
        keys = sorted((k for k in v if k not in skip), key=lambda k: k.encode("utf-8"))
        item(h, "{")
        item(h, str(len(keys)))
        for k in keys:
            item(h, k)
            canon(h, v[k])
    else:
        raise TypeError(type(v))


def field(h, data):
    """The tokenizer fingerprint's unit: u32 little-endian length, then bytes."""
    if isinstance(data, int):
        data = str(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    h.update(struct.pack("<I", len(data)))
    h.update(data)


def tokenizer_fp(path):
    """The canonical stream documented in tokenizer/tokenizer.h."""
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    h = hashlib.sha256()
    field(h, "tandem.tokenizer.v1")
    field(h, "normalizer")
    norm = tj.get("normalizer")
    field(h, "none" if norm is None else "NFC")
    field(h, "pre_tokenizer")
    pt = tj.get("pre_tokenizer")
    steps = [] if pt is None else (pt["pretokenizers"] if pt["type"] == "Sequence" else [pt])
    field(h, len(steps))
    for st in steps:
        if st["type"] == "Split":
            kind = "Regex" if "Regex" in st["pattern"] else "String"
            for x in ("Split", kind, st["pattern"][kind], "Isolated", "invert=0"):
                field(h, x)
        else:
            for x in ("ByteLevel", "add_prefix_space=0",
                      "use_regex=%d" % (1 if st.get("use_regex", True) else 0)):
                field(h, x)
    model = tj["model"]
    for x in ("model", "BPE", "ignore_merges=%d" % (1 if model.get("ignore_merges") else 0)):
        field(h, x)
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    field(h, "vocab")
    field(h, len(vocab))
    for tok, i in vocab:
        field(h, i)
        field(h, tok)
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges") or []]
    field(h, "merges")
    field(h, len(merges))
    for left, right in merges:
        field(h, left)
        field(h, right)
    added = sorted(tj.get("added_tokens") or [], key=lambda a: a["id"])
    field(h, "added")
    field(h, len(added))
    for t in added:
        field(h, t["id"])
        field(h, t["content"])
        field(h, "special=%d normalized=%d lstrip=%d rstrip=%d" % tuple(
            1 if t.get(k) else 0 for k in ("special", "normalized", "lstrip", "rstrip")))
    field(h, "decoder")
    field(h, "ByteLevel")
    return h.hexdigest()


def semantic_key(path):
    """What makes two tokenizer files the same tokenizer, compared as data."""
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    m = tj["model"]
    merges = [x if isinstance(x, str) else " ".join(x) for x in (m.get("merges") or [])]
    added = sorted((a["id"], a["content"], bool(a.get("special"))) for a in
                   tj.get("added_tokens") or [])
    return json.dumps([m.get("type"), sorted(m["vocab"].items(), key=lambda kv: kv[1]), merges,
                       added, tj.get("normalizer"), tj.get("pre_tokenizer")], sort_keys=True)


def st_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def model_fp(d):
    with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    tensors = {}
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        files = [single]
    else:
        with open(os.path.join(d, "model.safetensors.index.json"), encoding="utf-8") as f:
            files = [os.path.join(d, x) for x in sorted(set(json.load(f)["weight_map"].values()))]
    for p in files:
        for name, t in st_header(p).items():
            if name != "__metadata__":
                tensors[name] = t
    h = hashlib.sha256()
    item(h, "tandem-model-v1")
    canon(h, config, skip=("transformers_version", "_name_or_path", "dtype", "torch_dtype"))
    item(h, "tensors")
    item(h, str(len(tensors)))
    for name in sorted(tensors, key=lambda k: k.encode("utf-8")):
        item(h, name)
        item(h, tensors[name]["dtype"])
        item(h, ",".join(str(x) for x in tensors[name]["shape"]))
    return h.hexdigest()


def shuffled(v, rng):
    if isinstance(v, dict):
        keys = list(v)
        rng.shuffle(keys)
        return {k: shuffled(v[k], rng) for k in keys}
    if isinstance(v, list):
        return [shuffled(e, rng) for e in v]
    return v


def c_fp(binary, kind, path):
    r = subprocess.run([binary, kind, path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("FAIL: %s %s %s: %s" % (binary, kind, path, r.stderr.strip()))
    return r.stdout.strip()


def main():
    binary, root = sys.argv[1], sys.argv[2]
    failures = 0
    checked = 0
    rng = random.Random(1234)
    with tempfile.TemporaryDirectory() as tmp:
        tar = os.path.join(root, "tests/fixtures/tokenizer/fixtures.tar.gz")
        toks = []
        if os.path.exists(tar):
            with tarfile.open(tar) as t:
                for m in t.getmembers():
                    if m.name.endswith("tokenizer.json") and "/" not in m.name:
                        t.extract(m, tmp)
                        toks.append(os.path.join(tmp, m.name))
        for d in sorted(os.listdir(os.path.join(root, "models"))) if os.path.isdir(
                os.path.join(root, "models")) else []:
            p = os.path.join(root, "models", d, "tokenizer.json")
            if os.path.exists(p):
                toks.append(p)
        if not toks:
            raise SystemExit("FAIL: no tokenizer fixtures found")
        fps = {}
        for p in toks:
            want = tokenizer_fp(p)
            fps.setdefault(semantic_key(p), set()).add(want)
            got = c_fp(binary, "tokenizer-fp", p)
            checked += 1
            if got != want:
                failures += 1
                print("FAIL tokenizer %s: C %s, reference %s" % (p, got, want))
            # Reformatted copy with merges in the other form: same fingerprint.
            with open(p, encoding="utf-8") as f:
                tj = json.load(f)
            merges = tj["model"].get("merges") or []
            tj["model"]["merges"] = [m.split(" ", 1) if isinstance(m, str) else " ".join(m)
                                     for m in merges]
            copy = os.path.join(tmp, "reformatted.json")
            with open(copy, "w", encoding="utf-8") as f:
                json.dump(shuffled(tj, rng), f, indent=3, ensure_ascii=True)
            got2 = c_fp(binary, "tokenizer-fp", copy)
            checked += 1
            if got2 != want:
                failures += 1
                print("FAIL reformatted copy of %s hashes %s, want %s" % (p, got2, want))
        # Changing what the tokenizer does changes the fingerprint.
        with open(toks[0], encoding="utf-8") as f:
            base = json.load(f)
        base_fp = tokenizer_fp(toks[0])

        def swap_vocab(t):
            items = sorted(t["model"]["vocab"].items(), key=lambda kv: kv[1])
            (a, ia), (b, ib) = items[300], items[301]
            t["model"]["vocab"][a], t["model"]["vocab"][b] = ib, ia

        def drop_merge(t):
            t["model"]["merges"] = t["model"]["merges"][:-1]

        def flip_special(t):
            t["added_tokens"][0]["special"] = not t["added_tokens"][0].get("special")

        def other_pattern(t):
            pt = t["pre_tokenizer"]
            steps = pt["pretokenizers"] if pt["type"] == "Sequence" else [pt]
            for st in steps:
                if st["type"] == "ByteLevel":
                    st["use_regex"] = not st.get("use_regex", True)

        for name, change in (("vocab ids", swap_vocab), ("merges", drop_merge),
                             ("added token", flip_special), ("pre-tokenizer", other_pattern)):
            t = json.loads(json.dumps(base))
            change(t)
            variant = os.path.join(tmp, "variant.json")
            with open(variant, "w", encoding="utf-8") as f:
                json.dump(t, f)
            got = c_fp(binary, "tokenizer-fp", variant)
            want = tokenizer_fp(variant)
            checked += 1
            if got != want or got == base_fp:
                failures += 1
                print("FAIL changing the %s: C %s, reference %s, unchanged %s" % (
                    name, got, want, base_fp))
        all_fps = [fp for v in fps.values() for fp in v]
        if len(set(all_fps)) != len(fps) or any(len(v) != 1 for v in fps.values()):
            failures += 1
            print("FAIL fingerprints do not separate the %d distinct tokenizers" % len(fps))
        eng = os.path.join(root, "tests/fixtures/engine")
        dirs = [os.path.join(eng, d, "model") for d in sorted(os.listdir(eng))] if os.path.isdir(
            eng) else []
        dirs += [os.path.join(root, "models", d) for d in sorted(os.listdir(os.path.join(
            root, "models")))] if os.path.isdir(os.path.join(root, "models")) else []
        dirs = [d for d in dirs if os.path.exists(os.path.join(d, "config.json"))]
        if not dirs:
            raise SystemExit("FAIL: no model fixtures found")
        for d in dirs:
            want = model_fp(d)
            got = c_fp(binary, "model-fp", d)
            checked += 1
            if got != want:
                failures += 1
                print("FAIL model %s: C %s, reference %s" % (d, got, want))
    print("%d fingerprints compared, %d failures" % (checked, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
