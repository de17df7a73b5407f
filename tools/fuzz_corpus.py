#!/usr/bin/python3
"""Writes the seed corpora of the fuzzing harnesses (tests/fuzz/corpus/).

Each harness gets a few small, real inputs: the bundled models' config.json,
tiny tokenizer.json, safetensors and .npy files, configuration files of each
service, and valid encoded protobuf messages of every kind the services
decode (built from the .proto files with grpc_tools). A harness's first input
byte picks its mode or message type where it has several (tests/fuzz/fuzz_*.c
say which); the files here are named for what they hold. Deterministic:
running it again writes the same bytes.

    /usr/bin/python3 tools/fuzz_corpus.py [ROOT]
"""
import importlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- tokenizer -------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte-level alphabet: byte -> printable code point."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_tokenizer(variant):
    """A byte-level BPE tokenizer.json with every byte and a few merges."""
    alpha = bytes_to_unicode()
    vocab = {alpha[b]: b for b in range(256)}
    merges = []
    for word in ["he", "ll", "hell", "hello", "\u0120w", "or", "\u0120wor", "ld"]:
        # merge the longest known prefix with the rest
        for i in range(1, len(word)):
            a, b = word[:i], word[i:]
            if a in vocab and b in vocab:
                merges.append([a, b])
                vocab[word] = len(vocab)
                break
    added = []
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for i, s in enumerate(specials):
        added.append({"id": len(vocab) + i, "content": s, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False,
                      "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": variant == "gpt2"}
    if variant == "gpt2":
        pre = byte_level
        normalizer = None
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex":
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            dict(byte_level, use_regex=False)]}
        normalizer = {"type": "NFC"}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added, "normalizer": normalizer, "pre_tokenizer": pre,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": variant == "ignore_merges",
                  "vocab": vocab, "merges": merges},
    }
    return json.dumps(tok, ensure_ascii=False, separators=(",", ":"))


def tokenizer_corpus():
    for v in ["gpt2", "qwen", "ignore_merges"]:
        write("tokenizer", "load-%s.json" % v, b"\x00" + tiny_tokenizer(v).encode())
    texts = {
        "ascii": "Hello, world! 123",
        "code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n-1)\n",
        "unicode": "caf\u00e9 na\u00efve \u6f22\u5b57 \U0001F600 \u0645\u0631\u062d\u0628\u0627",
        "combining": "e\u0301 a\u0308 \u1100\u1161",
        "specials": "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
        "spaces": "  \t\n\n   x  \r\n",
    }
    for k, t in texts.items():
        write("tokenizer", "encode-%s.txt" % k, b"\x01" + t.encode())
    write("tokenizer", "encode-invalid-utf8.bin", b"\x01ab\xc3(\xff\xfe")
    ids = [72, 101, 108, 108, 111, 4093, 4094, 4095, 200, 4200, 0, 255]
    write("tokenizer", "decode-ids.bin", b"\x02" + struct.pack("<%dI" % len(ids), *ids))
    write("tokenizer", "decode-split-utf8.bin", b"\x02" + struct.pack("<3I", 195, 169, 33))
    write("tokenizer", "chat.bin", b"\x03system\0You are helpful.\0user\0Hello!")


# ---- safetensors -----------------------------------------------------------

def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_corpus():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    write("safetensors", "one-f32.safetensors", safetensors([("w", "F32", [2, 3], f32)]))
    write("safetensors", "many.safetensors", safetensors([
        ("model.embed_tokens.weight", "BF16", [4, 2], bytes(16)),
        ("model.norm.weight", "F16", [2], bytes(4)),
        ("model.layers.0.mlp.up_proj.weight", "F32", [1, 2, 1], bytes(8)),
        ("scalar", "I64", [], bytes(8)),
        ("empty", "U8", [0, 5], b""),
        ("flags", "BOOL", [3], b"\x01\x00\x01"),
        ("fp8", "F8_E4M3", [2], b"\x10\x20"),
    ], metadata={"format": "pt"}))
    write("safetensors", "truncated.safetensors", safetensors([("w", "F32", [2, 3], f32)])[:-4])
    write("safetensors", "empty-header.safetensors", struct.pack("<Q", 2) + b"{}")


# ---- model config ----------------------------------------------------------

def model_config_corpus():
    for m in ["demo-target", "demo-drafter"]:
        shutil.copyfile(os.path.join(ROOT, "models", m, "config.json"),
                        os.path.join(OUT, "model_config", m + ".json"))
    fx = os.path.join(ROOT, "tests", "fixtures", "engine")
    for d in sorted(os.listdir(fx)):
        p = os.path.join(fx, d, "model", "config.json")
        if os.path.exists(p):
            shutil.copyfile(p, os.path.join(OUT, "model_config", "fixture-%s.json" % d))
    write("model_config", "minimal.json", '{"model_type":"qwen3_5_text"}')
    write("model_config", "wrapped.json", json.dumps({
        "model_type": "qwen3_5", "tie_word_embeddings": False,
        "text_config": {"model_type": "qwen3_5_text", "vocab_size": 1000, "hidden_size": 64,
                        "num_hidden_layers": 4, "num_attention_heads": 2,
                        "num_key_value_heads": 1, "head_dim": 32,
                        "full_attention_interval": 2, "tie_word_embeddings": False,
                        "rope_theta": 1e6, "partial_rotary_factor": 0.5}}))


# ---- service configuration -------------------------------------------------

def service_config_corpus():
    # first byte: 0 gateway, 1 verifier, 2 drafter; then the file, then flags
    def cfg(schema, yaml, *flags):
        return bytes([schema]) + yaml.encode() + b"".join(b"\0" + f.encode() for f in flags)
    write("service_config", "gateway.bin", cfg(0, (
        "listen: 127.0.0.1:7700\nhealth_listen: 127.0.0.1:7701\nlog_level: info\n"
        "heartbeat_interval: 1s\nreplica_ttl: 5s\nmax_message_size: 64MiB\n"
        "tokenizer: models/demo-target/tokenizer.json\ndefault_max_tokens: 128\n"),
        "--log-level", "debug", "--replica-ttl=10s"))
    write("service_config", "verifier.bin", cfg(1, (
        "# the verifier of the local stack\nlisten: 0.0.0.0:7710\n"
        "health_listen: \"127.0.0.1:7711\"\nmodel: models/demo-target\nbackend: auto\n"
        "state_strategy: replay\nprefix_cache: off\nmax_sequences: 16\n"
        "max_context: auto\nmax_draft_tokens: 8\ndraft_timeout: 2s\n"),
        "--state-strategy", "extra_buffer", "--prefix-cache", "on"))
    write("service_config", "drafter.bin", cfg(2, (
        "listen: '[::1]:7720'\nhealth_listen: 127.0.0.1:7721\nmodel: models/demo-drafter\n"
        "drafter_kind: auto\ndraft_block_size: 4\nrun_ahead: auto\nreplica_id: d-1\n"),
        "--gateway", "127.0.0.1:7700", "--check-config"))
    write("service_config", "drafter-ngram.bin", cfg(2, "drafter_kind: ngram\n", "--help"))
    write("service_config", "errors.bin", cfg(1, (
        "listen: nowhere\nunknown_key: 1\nmax_sequences: -3\nmodel: [a, b]\n"),
        "--no-such-flag", "x", "stray"))
    write("service_config", "empty.bin", cfg(0, ""))
    write("service_config", "two-docs.bin", cfg(0, "---\nlisten: a:1\n---\nlisten: b:2\n"))


# ---- npy -------------------------------------------------------------------

def npy(shape, values, descr="<f4", fortran=False):
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, "True" if fortran else "False",
        "".join("%d, " % s for s in shape).rstrip(" ") if len(shape) != 1 else "%d," % shape[0])
    total = 10 + len(d) + 1
    d += " " * ((64 - total % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + \
        struct.pack("<%df" % len(values), *values)


def npy_corpus():
    write("npy", "vector.npy", npy([3], [1.0, 2.5, -3.0]))
    write("npy", "matrix.npy", npy([2, 3], [float(i) for i in range(6)]))
    write("npy", "scalar.npy", npy([], [7.0]))
    write("npy", "empty.npy", npy([0, 4], []))
    write("npy", "4d.npy", npy([1, 2, 1, 2], [0.5] * 4))
    write("npy", "f8.npy", npy([2], [0.0, 0.0], descr="<f8"))
    write("npy", "truncated.npy", npy([4], [1.0, 2.0, 3.0, 4.0])[:-6])


# ---- protobuf messages -----------------------------------------------------

# The order of fuzz_pbjson.c's message table.
PBJSON_MESSAGES = (
    "ProtocolVersion BuildInfo Descriptor SamplingParams ConfigEntry EffectiveConfig Counter "
    "Refusal DescribeRequest DescribeResponse TokenIds SequenceOpen Verdict SequenceClose "
    "DraftRequest DraftDistribution DraftBlock SequenceError DraftResponse ChatMessage ChatPrompt "
    "SpeculationParams GenerateRequest TokenChunk RequestStats GenerateComplete GenerateResponse "
    "TokenizeRequest TokenizeResponse DetokenizeRequest DetokenizeResponse GetModelInfoRequest "
    "ModelInfo GetStatusRequest ReplicaStatus PairStatus StatusResponse RegisterRequest "
    "RegisterResponse ReplicaLoad HeartbeatRequest HeartbeatResponse DeregisterRequest "
    "DeregisterResponse SnapshotTensor SnapshotLayout SnapshotChunk ExportSnapshotRequest "
    "ImportSnapshotResponse DrafterAssignment RunRequest RunComplete RunResponse").split()


def load_protos():
    out = tempfile.mkdtemp(prefix="tandem-fuzz-corpus-")
    include = os.path.join(ROOT, "proto")
    files = []
    for d, _, fs in os.walk(include):
        files += [os.path.relpath(os.path.join(d, f), include) for f in fs if f.endswith(".proto")]
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", include,
                    "--python_out=" + out] + sorted(files), cwd=include, check=True)
    sys.path.insert(0, out)
    mods = {}
    for name in ["common", "gateway", "verifier", "drafter", "registry", "snapshot"]:
        mods[name] = importlib.import_module("tandem.v1.%s_pb2" % name)
    return out, mods


def descriptor(pb, role, rid):
    c = pb["common"]
    return c.Descriptor(
        role=role, replica_id=rid, address="127.0.0.1:7710", model_name="demo-target",
        model_fingerprint="ab" * 32, tokenizer_fingerprint="cd" * 32, draft_block_size=4,
        max_draft_tokens=8, state_strategy=c.STATE_STRATEGY_REPLAY, prefix_cache=False,
        snapshot_layout_version=1, protocol=c.ProtocolVersion(major=1, minor=1),
        build=c.BuildInfo(version="0.1.0", git_revision="aa359b4", grpc_core="29.0.0",
                          compiler="GNU 12.2.0", build_type="RelWithDebInfo", backend="cpu"),
        drafter_kind=c.DRAFTER_KIND_MODEL if role == c.ROLE_DRAFTER else 0,
        vocab_size=4096, max_sequences=16, max_context=4096, instance_id="0123456789abcdef")


def protobuf_corpus():
    tmp, pb = load_protos()
    c, g, v, d, r = pb["common"], pb["gateway"], pb["verifier"], pb["drafter"], pb["registry"]
    sampling = c.SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=7)
    gen = {
        "text": g.GenerateRequest(text="def fibonacci(n):", max_tokens=64, sampling=sampling,
                                  stop=["\n\n", "```"], request_id="req-1",
                                  speculation=g.SpeculationParams(mode=g.SPECULATION_MODE_ON,
                                                                  block_size=4)),
        "ids": g.GenerateRequest(token_ids=c.TokenIds(ids=[331, 288, 72]), max_tokens=8,
                                 ignore_eos=True,
                                 speculation=g.SpeculationParams(mode=g.SPECULATION_MODE_OFF)),
        "chat": g.GenerateRequest(chat=g.ChatPrompt(messages=[
            g.ChatMessage(role="system", content="Be brief."),
            g.ChatMessage(role="user", content="Hello")], add_generation_prompt=True),
            sampling=c.SamplingParams(temperature=1.0, top_k=1)),
    }
    run = v.RunRequest(request_id="req-1", prompt_ids=[1, 2, 3, 4], max_tokens=16,
                       sampling=sampling, stop_token_ids=[4093, 4095],
                       drafter=v.DrafterAssignment(replica_id="drafter-1",
                                                   address="127.0.0.1:7720", block_size=4))
    run_plain = v.RunRequest(prompt_ids=[5], max_tokens=1)
    draft_reqs = {
        "open": d.DraftRequest(open=d.SequenceOpen(sequence_id=9, tokens=[1, 2, 3], block_size=4,
                                                   sampling=sampling, round=1, run_ahead=True)),
        "verdict": d.DraftRequest(verdict=d.Verdict(sequence_id=9, round=1, accepted=2,
                                                    next_token=17, block_size=4, position=6)),
        "close": d.DraftRequest(close=d.SequenceClose(sequence_id=9, reason="done")),
    }
    draft_resps = {
        "block": d.DraftResponse(block=d.DraftBlock(
            sequence_id=9, round=1, tokens=[5, 6, 7], token_probs=[0.9, 0.5, 0.25],
            dists=[d.DraftDistribution(ids=[5, 8], probs=[0.9, 0.1]),
                   d.DraftDistribution(ids=[6], probs=[1.0]),
                   d.DraftDistribution(ids=[7, 1, 2], probs=[0.25, 0.5, 0.25])],
            position=17, draft_micros=1200)),
        "greedy-block": d.DraftResponse(block=d.DraftBlock(sequence_id=9, round=2, tokens=[5],
                                                           position=17, ahead=True,
                                                           assumed_token=3)),
        "error": d.DraftResponse(error=d.SequenceError(sequence_id=9, message="out of memory")),
    }
    reg = r.RegisterRequest(descriptor=descriptor(pb, c.ROLE_VERIFIER, "verifier-1"))
    reg_d = r.RegisterRequest(descriptor=descriptor(pb, c.ROLE_DRAFTER, "drafter-1"))
    hb = r.HeartbeatRequest(replica_id="verifier-1", instance_id="0123456789abcdef",
                            load=r.ReplicaLoad(active_sequences=2, free_slots=14,
                                               tokens_per_second=123.5,
                                               counters=[c.Counter(name="rounds", value=10)]))
    dereg = r.DeregisterRequest(replica_id="verifier-1", reason="SIGTERM",
                                instance_id="0123456789abcdef")
    tok = g.TokenizeRequest(text="Hello")
    detok = g.DetokenizeRequest(ids=[72, 101, 4095])

    # fuzz_request.c: mode byte, then the message.
    def req(name, mode, m):
        write("request", name + ".pb", bytes([mode]) + m.SerializeToString())
    for k, m in gen.items():
        req("generate-" + k, 0, m)
    req("run", 1, run)
    req("run-plain", 1, run_plain)
    for k, m in draft_reqs.items():
        req("draft-request-" + k, 2, m)
    for k, m in draft_resps.items():
        req("draft-response-" + k, 3, m)
    req("register-verifier", 4, reg)
    req("register-drafter", 4, reg_d)
    req("heartbeat", 5, hb)
    req("deregister", 6, dereg)
    req("tokenize", 7, tok)
    req("detokenize", 8, detok)

    # fuzz_pbjson.c: index of the message type, then the message.
    def pj(m):
        name = m.DESCRIPTOR.name
        write("pbjson", name + ".pb", bytes([PBJSON_MESSAGES.index(name)]) +
              m.SerializeToString())
    stats = g.RequestStats(prompt_tokens=3, generated_tokens=8, rounds=4, verifier="verifier-1",
                           drafter="drafter-1", speculation="on")
    for m in [gen["text"], run, draft_reqs["open"], draft_resps["block"], reg.descriptor, hb,
              g.GenerateResponse(tokens=g.TokenChunk(ids=[1, 2], text="hi", index=0)),
              g.GenerateResponse(complete=g.GenerateComplete(
                  finish_reason=g.FINISH_REASON_LENGTH, stats=stats)),
              g.StatusResponse(replicas=[g.ReplicaStatus(descriptor=reg.descriptor)]),
              g.ModelInfo(), c.EffectiveConfig(entries=[c.ConfigEntry(
                  key="listen", value="127.0.0.1:7700", source="default", reason="")]),
              r.RegisterResponse(replica_id="verifier-1", heartbeat_interval_ms=1000,
                                 ttl_ms=5000, refusals=[c.Refusal(rule="same-tokenizer",
                                                                  message="differ")]),
              pb["snapshot"].SnapshotChunk(), v.RunResponse(tokens=g.TokenChunk(ids=[4]))]:
        pj(m)
    snapshot_corpus(pb)
    shutil.rmtree(tmp)


# ---- state snapshots (fuzz_snapshot.c) --------------------------------------

def crc32c(data):
    """CRC32C (Castagnoli), reflected, as the snapshot chunks carry it."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ table[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def snapshot_corpus(pb):
    """Snapshots of the engine fixture f32_gqa as chunk streams: the layout
    engine/snapshot.h documents, a payload of small floats."""
    import hashlib
    sn = pb["snapshot"]
    with open(os.path.join(ROOT, "tests", "fixtures", "engine", "f32_gqa", "model",
                           "config.json")) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)
    K, Hk, Dk = cfg["linear_conv_kernel_dim"], cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
    Hv, Dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
    nKV, D = cfg["num_key_value_heads"], cfg["head_dim"]
    conv_dim = 2 * Hk * Dk + Hv * Dv

    def stream(committed, chunk, mode, corrupt=None):
        tensors, off = [], 0
        for L, kind in enumerate(cfg["layer_types"]):
            if kind == "linear_attention":
                shapes = [("conv", [K - 1, conv_dim]), ("recurrent", [Hv, Dk, Dv])]
            else:
                shapes = [("key", [committed, nKV, D]), ("value", [committed, nKV, D])]
            for name, shape in shapes:
                n = 4
                for d in shape:
                    n *= d
                tensors.append(sn.SnapshotTensor(name="layers.%d.%s" % (L, name), layer=L,
                                                 dtype=sn.SNAPSHOT_DTYPE_F32, shape=shape,
                                                 offset=off, nbytes=n))
                off += n
        payload = b"".join(struct.pack("<f", ((i % 17) - 8) * 0.01) for i in range(off // 4))
        tokens = [(7 * i + 3) % cfg["vocab_size"] for i in range(committed)]
        layout = sn.SnapshotLayout(layout_version=1, model_fingerprint="fuzz-snapshot-model",
                                   committed_position=committed, tokens=tokens, tensors=tensors,
                                   total_bytes=off, sha256=hashlib.sha256(payload).digest())
        chunks = [sn.SnapshotChunk(snapshot_id="seed", index=0, layout=layout)]
        for at in range(0, off, chunk):
            data = payload[at:at + chunk]
            chunks.append(sn.SnapshotChunk(snapshot_id="seed", index=len(chunks), offset=at,
                                           data=data, crc32c=crc32c(data)))
        chunks[-1].last = True
        if corrupt:
            corrupt(chunks)
        out = bytes([mode])
        for c in chunks:
            b = c.SerializeToString()
            out += struct.pack("<I", len(b))[:3] + b
        return out

    def bad_crc(cs):
        cs[2].crc32c ^= 1

    def truncated(cs):
        cs[-2].last = False
        del cs[-1]

    def bad_sha(cs):
        cs[0].layout.sha256 = bytes(32)

    write("snapshot", "valid-extra-buffer.bin", stream(5, 4096, 0))
    write("snapshot", "valid-replay.bin", stream(9, 8192, 4))
    write("snapshot", "valid-no-buffer-fixcrc.bin", stream(3, 2048, 3))
    write("snapshot", "valid-empty.bin", stream(0, 65536, 0))
    write("snapshot", "bad-crc.bin", stream(5, 4096, 0, bad_crc))
    write("snapshot", "truncated.bin", stream(5, 4096, 0, truncated))
    write("snapshot", "bad-sha.bin", stream(2, 4096, 0, bad_sha))


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "model_config"))
    tokenizer_corpus()
    safetensors_corpus()
    model_config_corpus()
    service_config_corpus()
    npy_corpus()
    protobuf_corpus()
    total = 0
    for d, _, fs in os.walk(OUT):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in fs)
    print("fuzz corpora written to %s: %d bytes" % (OUT, total))


if __name__ == "__main__":
    main()
