#!/usr/bin/python3
"""State snapshots through the services (verifiers as real processes on
loopback, the bundled demo models, Python grpcio):

  move      a request exported mid-way from verifier A (replay strategy) and
            imported into verifier B (extra_buffer, then no_buffer), where a
            Run with the snapshot_id continues it: the tokens, greedy, are
            those of the same request run on one verifier without a move;
            with detach, A's Run ends with ABORTED naming the snapshot; a
            sampled request with a seed moves with its random stream and
            continues with the tokens it would have drawn.
  spec      the same with a drafter speculating on both sides: the drafter
            reopens the moved sequence on B; greedy, the tokens are plain
            decoding's.
  refusals  corrupt imports (CRC32C, SHA-256, a missing chunk, a truncated
            stream, another model's fingerprint, another layout version, a
            tensor's shape) are refused with INVALID_ARGUMENT or
            FAILED_PRECONDITION naming the field, while a request running on
            the importer goes on untouched; unknown snapshot ids; the
            cluster token guards both methods.
  bounds    imported snapshots beyond max_snapshots are refused
            (RESOURCE_EXHAUSTED); one not continued within snapshot_ttl is
            dropped (a Run with its id: NOT_FOUND); a snapshot continues once.

  drain     eight requests streaming through the gateway (greedy, seeded
            sampling, speculating) on verifier A when A gets SIGTERM: each
            moves to verifier B through a snapshot and finishes there with
            the tokens of an unmoved run, B's drafter re-syncs (speculation
            goes on), A exits 0; then `tandem drain B` moves two more to C;
            a drafter told to drain (SIGTERM) mid-request leaves it to go on
            without speculation, with the same tokens.
  failover  the serving verifier is killed (SIGKILL) mid-request: the gateway
            resumes each request on another verifier from the prompt and the
            tokens streamed; greedy and seeded requests (plain and with fixed
            blocks) end with the tokens of an uninterrupted run; without a
            spare verifier the client gets UNAVAILABLE naming the cause, at
            once.

usage: snapshot_test.py CASE --cli PATH --gateway PATH --verifier PATH
                        --drafter PATH --source ROOT
"""
import argparse
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "services"))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import services_test as st  # noqa: E402
import e2e_test as e2e  # noqa: E402

check = st.check
EXPORT = "/tandem.v1.Verifier/ExportSnapshot"
IMPORT = "/tandem.v1.Verifier/ImportSnapshot"
RUN = "/tandem.v1.Verifier/Run"


def classes():
    c = st.client()
    chunk, _, _ = c._method(IMPORT)
    export_req, _, _ = c._method(EXPORT)
    run_req, run_resp, _ = c._method(RUN)
    _, import_resp, _ = c._method(IMPORT)
    return chunk, export_req, run_req, run_resp, import_resp


def grpc_mod():
    import grpc
    return grpc


def prompt(n, seed=3):
    return [(seed * 7919 + i * 104729) % 3000 + 10 for i in range(n)]


def verifier(gw, strategy, *extra):
    return st.replica("verifier", gw, "--model", e2e.TARGET, "--state-strategy", strategy,
                      "--max-draft-tokens", "8", *extra)


class Runner:
    """A Run read on a thread of its own: tokens as they come, the end status."""

    def __init__(self, v, req, metadata=()):
        grpc = grpc_mod()
        _, _, run_req, run_resp, _ = classes()
        from google.protobuf import json_format
        self.ch = grpc.insecure_channel(v.addr())
        fn = self.ch.unary_stream(RUN, request_serializer=run_req.SerializeToString,
                                  response_deserializer=run_resp.FromString)
        self.it = fn(json_format.ParseDict(req, run_req()), timeout=240,
                     metadata=list(metadata))
        self.tokens, self.first_index = [], None
        self.code, self.details, self.finish = None, "", None
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        grpc = grpc_mod()
        try:
            for m in self.it:
                if m.HasField("tokens"):
                    if self.first_index is None:
                        self.first_index = m.tokens.index
                    check(m.tokens.index == (self.first_index + len(self.tokens)),
                          "token chunk index %d after %d tokens" % (m.tokens.index,
                                                                    len(self.tokens)))
                    self.tokens += list(m.tokens.ids)
                if m.HasField("complete"):
                    self.finish = m.complete.finish_reason
            self.code = "OK"
        except grpc.RpcError as e:
            self.code, self.details = e.code().name, e.details() or ""

    def wait(self, timeout=240):
        self.t.join(timeout)
        self.ch.close()
        return self


def run_all(v, req, metadata=()):
    return Runner(v, req, metadata).wait()


def export(v, request_id, chunk_bytes=0, detach=False, metadata=()):
    """Returns (code, details, [chunk messages])."""
    grpc = grpc_mod()
    chunk, export_req, _, _, _ = classes()
    ch = grpc.insecure_channel(v.addr())
    fn = ch.unary_stream(EXPORT, request_serializer=export_req.SerializeToString,
                         response_deserializer=chunk.FromString)
    out = []
    try:
        for m in fn(export_req(request_id=request_id, chunk_bytes=chunk_bytes, detach=detach),
                    timeout=60, metadata=list(metadata)):
            out.append(m)
        return "OK", "", out
    except grpc.RpcError as e:
        return e.code().name, e.details() or "", out
    finally:
        ch.close()


def import_(v, chunks, metadata=()):
    """Streams chunks (messages) in; returns (code, details, response)."""
    grpc = grpc_mod()
    chunk, _, _, _, import_resp = classes()
    ch = grpc.insecure_channel(v.addr())
    fn = ch.stream_unary(IMPORT, request_serializer=chunk.SerializeToString,
                         response_deserializer=import_resp.FromString)
    try:
        resp = fn(iter(list(chunks)), timeout=60, metadata=list(metadata))
        return "OK", "", resp
    except grpc.RpcError as e:
        return e.code().name, e.details() or "", None
    finally:
        ch.close()


def copy(m):
    n = type(m)()
    n.CopyFrom(m)
    return n


def export_mid_run(v, req, min_tokens, detach):
    """Starts a Run on v, exports it once min_tokens came; (runner, chunks)."""
    r = Runner(v, req)
    deadline = time.time() + 120
    while len(r.tokens) < min_tokens and r.code is None and time.time() < deadline:
        time.sleep(0.002)
    code, details, chunks = export(v, req["request_id"], chunk_bytes=4096, detach=detach)
    check(code == "OK", "ExportSnapshot of a running request: %s %s" % (code, details))
    return r, chunks


# ---- cases ---------------------------------------------------------------------

def case_move():
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    a = verifier(gw, "replay")
    b = verifier(gw, "extra_buffer")
    c = verifier(gw, "no_buffer")
    st.wait_status(gw, lambda s: len(s.get("replicas", [])) >= 3, "three verifiers")
    N = 600
    base = {"prompt_ids": prompt(40), "max_tokens": N, "sampling": {"temperature": 0}}
    ref = run_all(a, dict(base, request_id="unmoved"))
    check(ref.code == "OK" and len(ref.tokens) == N, "the unmoved run: %s %s, %d tokens" %
          (ref.code, ref.details, len(ref.tokens)))

    # Detached: A stops at the snapshot; B continues.
    r, chunks = export_mid_run(a, dict(base, request_id="moved"), 8, detach=True)
    r.wait()
    check(r.code == "ABORTED" and chunks and chunks[0].snapshot_id in r.details,
          "A's Run after a detaching export: %s %s" % (r.code, r.details))
    if not chunks:
        return
    c0 = chunks[0]
    g = c0.continuation.generated
    check(len(chunks) > 3 and c0.layout.total_bytes > 4096 and
          all(len(x.data) <= 4096 for x in chunks),
          "%d chunks of at most 4096 bytes for %d bytes" % (len(chunks), c0.layout.total_bytes))
    check(c0.layout.committed_position == 40 + g - 1 and 8 <= g < N,
          "snapshot at %d positions, %d generated" % (c0.layout.committed_position, g))
    check(r.tokens == ref.tokens[:g], "A streamed exactly the %d tokens before the snapshot "
          "(got %d)" % (g, len(r.tokens)))
    code, details, resp = import_(b, chunks)
    check(code == "OK" and resp.committed_position == c0.layout.committed_position,
          "ImportSnapshot into B: %s %s" % (code, details))
    if code != "OK":
        return
    print("moved at %d generated tokens: %d positions, %d chunks, snapshot %s" %
          (g, c0.layout.committed_position, len(chunks), resp.snapshot_id), flush=True)
    cont = run_all(b, {"request_id": "moved", "snapshot_id": resp.snapshot_id})
    check(cont.code == "OK" and cont.first_index == g,
          "B's Run with the snapshot: %s %s, first index %s (want %d)" %
          (cont.code, cont.details, cont.first_index, g))
    check(r.tokens + cont.tokens == ref.tokens,
          "replay -> extra_buffer: moved tokens == unmoved (diverge at %s)" %
          next((i for i, (x, y) in enumerate(zip(r.tokens + cont.tokens, ref.tokens))
                if x != y), min(len(r.tokens + cont.tokens), len(ref.tokens))))

    # Not detached, with a drafter-free request still running on A: C continues
    # a copy; A's own run goes on to the end, the same tokens.
    r2, chunks2 = export_mid_run(a, dict(base, request_id="copied"), 20, detach=False)
    code, details, resp2 = import_(c, chunks2)
    check(code == "OK", "ImportSnapshot into C: %s %s" % (code, details))
    r2.wait()
    check(r2.code == "OK" and r2.tokens == ref.tokens, "A's run after a plain export: %s %s" %
          (r2.code, r2.details))
    if code == "OK":
        g2 = chunks2[0].continuation.generated
        cont2 = run_all(c, {"snapshot_id": resp2.snapshot_id})
        check(cont2.code == "OK" and cont2.first_index == g2 and
              ref.tokens[:g2] + cont2.tokens == ref.tokens,
              "replay -> no_buffer: continuation from %d: %s %s" % (g2, cont2.code, cont2.details))

    # Sampled, seeded: the random stream moves with the state.
    sampled = dict(base, max_tokens=300, sampling={"temperature": 0.9, "top_p": 0.95,
                                                   "seed": 1234})
    sref = run_all(a, dict(sampled, request_id="sampled-ref"))
    r3, chunks3 = export_mid_run(a, dict(sampled, request_id="sampled"), 10, detach=True)
    r3.wait()
    code, details, resp3 = import_(b, chunks3)
    check(code == "OK", "ImportSnapshot of a sampled request: %s %s" % (code, details))
    if code == "OK":
        cont3 = run_all(b, {"snapshot_id": resp3.snapshot_id})
        check(sref.code == "OK" and cont3.code == "OK" and
              r3.tokens + cont3.tokens == sref.tokens,
              "sampled (seed 1234) moved at %d tokens == unmoved: %s %s" %
              (len(r3.tokens), cont3.code, cont3.details))
    e2e.stop_all()


def case_tensor_parallel():
    """Snapshots of a split verifier are in the whole model's layout: a request
    moves from a verifier split over 2 ranks to a whole one, and from there to
    one split over 4, each time continuing with the tokens of an unmoved run."""
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    a = verifier(gw, "replay", "--tensor-parallel", "2")
    b = verifier(gw, "extra_buffer")
    c = verifier(gw, "no_buffer", "--tensor-parallel", "4")
    st.wait_status(gw, lambda s: len(s.get("replicas", [])) >= 3, "three verifiers")
    N = 300
    base = {"prompt_ids": prompt(40), "max_tokens": N, "sampling": {"temperature": 0}}
    ref = run_all(b, dict(base, request_id="unmoved"))
    check(ref.code == "OK" and len(ref.tokens) == N, "the unmoved run: %s %s" %
          (ref.code, ref.details))
    r, chunks = export_mid_run(a, dict(base, request_id="moved"), 8, detach=True)
    r.wait()
    if not check(chunks, "no snapshot from the split verifier"):
        return
    g = chunks[0].continuation.generated
    check(r.tokens == ref.tokens[:g], "tp 2: the tokens before the snapshot")
    code, details, resp = import_(b, chunks)
    if not check(code == "OK", "tp 2 -> whole: ImportSnapshot: %s %s" % (code, details)):
        return
    # B continues it; midway it moves on to C (split over 4).
    r2, chunks2 = export_mid_run(b, {"request_id": "moved", "snapshot_id": resp.snapshot_id},
                                 20, detach=True)
    r2.wait()
    if not check(chunks2, "no snapshot from the whole verifier"):
        return
    g2 = chunks2[0].continuation.generated
    code, details, resp2 = import_(c, chunks2)
    if not check(code == "OK", "whole -> tp 4: ImportSnapshot: %s %s" % (code, details)):
        return
    cont = run_all(c, {"request_id": "moved", "snapshot_id": resp2.snapshot_id})
    got = r.tokens + r2.tokens + cont.tokens
    check(cont.code == "OK" and cont.first_index == g2 and got == ref.tokens,
          "tp 2 -> whole -> tp 4: moved tokens == unmoved (%s %s; diverge at %s)" %
          (cont.code, cont.details, next((i for i, (x, y) in enumerate(zip(got, ref.tokens))
                                          if x != y), min(len(got), len(ref.tokens)))))
    print("moved at %d and %d generated tokens: tp 2 -> whole -> tp 4, %d bytes a snapshot" %
          (g, g2, chunks2[0].layout.total_bytes), flush=True)
    e2e.stop_all()


def case_spec():
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    a = verifier(gw, "replay")
    b = verifier(gw, "extra_buffer")
    d = st.replica("drafter", gw, "--model", e2e.DRAFTER, "--state-strategy", "replay",
                   "--draft-block-size", "4")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 2, "two verifier/drafter pairs")
    N = 400
    plain = {"prompt_ids": prompt(32, 11), "max_tokens": N, "sampling": {"temperature": 0}}
    drafter = {"replica_id": "d", "address": d.addr(), "block_size": 4}
    ref = run_all(a, dict(plain, request_id="plain"))
    r, chunks = export_mid_run(a, dict(plain, request_id="spec", drafter=drafter), 12,
                               detach=True)
    r.wait()
    check(r.code == "ABORTED", "the speculating run after a detaching export: %s %s" %
          (r.code, r.details))
    code, details, resp = import_(b, chunks)
    check(code == "OK", "ImportSnapshot of a speculating request: %s %s" % (code, details))
    if code != "OK":
        return
    cont = run_all(b, {"snapshot_id": resp.snapshot_id, "drafter": drafter})
    check(ref.code == "OK" and cont.code == "OK" and r.tokens + cont.tokens == ref.tokens,
          "speculating on A, moved at %d tokens, speculating on B == plain greedy: %s %s" %
          (len(r.tokens), cont.code, cont.details))
    desc = "/tandem.v1.Verifier/Describe"
    for v, name in ((a, "A"), (b, "B")):
        n = e2e.counter(v.addr(), desc, "speculative_rounds") or 0
        print("%s verified %d draft blocks" % (name, n), flush=True)
        check(n > 0, "%s verified draft blocks for the moved request" % name)
    e2e.stop_all()


def case_refusals():
    tokfile = st.write("cluster.token", "a-cluster-secret\n")
    md = (("x-tandem-cluster-token", "a-cluster-secret"),)
    gw = st.gateway("--tokenizer", e2e.TOKENIZER, "--cluster-token-file", tokfile)
    a = verifier(gw, "extra_buffer", "--cluster-token-file", tokfile)
    b = verifier(gw, "no_buffer", "--cluster-token-file", tokfile)
    st.wait_status(gw, lambda s: len(s.get("replicas", [])) >= 2, "two verifiers")
    base = {"prompt_ids": prompt(30, 5), "max_tokens": 400, "sampling": {"temperature": 0}}

    # The methods are for peers.
    code, details, _ = export(a, "x")
    check(code in ("UNAUTHENTICATED", "PERMISSION_DENIED"),
          "ExportSnapshot without the cluster token: %s %s" % (code, details))
    code, details, _ = import_(b, [])
    check(code in ("UNAUTHENTICATED", "PERMISSION_DENIED"),
          "ImportSnapshot without the cluster token: %s %s" % (code, details))
    code, details, _ = export(a, "no-such-request", metadata=md)
    check(code == "NOT_FOUND" and "no-such-request" in details,
          "export of an unknown request: %s %s" % (code, details))

    r = Runner(a, dict(base, request_id="src"), md)
    deadline = time.time() + 60
    while len(r.tokens) < 5 and r.code is None and time.time() < deadline:
        time.sleep(0.002)
    code, details, chunks = export(a, "src", chunk_bytes=2048, metadata=md)
    check(code == "OK" and len(chunks) > 4, "export: %s %s" % (code, details))
    r.wait()
    if code != "OK":
        return
    # A request running on the importer while imports are refused.
    bystander = Runner(b, dict(base, request_id="bystander"), md)
    ref = run_all(a, dict(base, request_id="bystander-ref"), md)

    def cases():
        x = [copy(m) for m in chunks]
        data = bytearray(x[2].data)
        data[7] ^= 1
        x[2].data = bytes(data)
        yield "crc32c", x, "INVALID_ARGUMENT", ["chunk 2", "crc32c"]
        x = [copy(m) for m in chunks]
        data = bytearray(x[2].data)
        data[7] ^= 1
        x[2].data = bytes(data)
        x[2].crc32c = crc32c(bytes(data))
        yield "sha256", x, "INVALID_ARGUMENT", ["sha256"]
        x = [copy(m) for m in chunks]
        del x[2]
        yield "missing chunk", x, "INVALID_ARGUMENT", ["expected chunk 2", "got 3"]
        x = [copy(m) for m in chunks]
        x.insert(3, copy(chunks[2]))
        yield "repeated chunk", x, "INVALID_ARGUMENT", ["expected chunk 3", "got 2"]
        yield "truncated", [copy(m) for m in chunks[:-1]], "INVALID_ARGUMENT", ["last"]
        x = [copy(m) for m in chunks]
        fp = x[0].layout.model_fingerprint
        x[0].layout.model_fingerprint = "0" * 64
        yield "fingerprint", x, "FAILED_PRECONDITION", ["model_fingerprint", "0" * 64, fp]
        x = [copy(m) for m in chunks]
        x[0].layout.layout_version = 7
        yield "layout version", x, "FAILED_PRECONDITION", ["layout_version", "7", "1"]
        x = [copy(m) for m in chunks]
        x[0].layout.tensors[0].shape[1] += 1
        yield "shape", x, "INVALID_ARGUMENT", ["shape", x[0].layout.tensors[0].name]
        x = [copy(m) for m in chunks]
        x[-1].data = bytes(x[-1].data) + b"\0" * 8
        x[-1].crc32c = crc32c(bytes(x[-1].data))
        yield "more bytes", x, "INVALID_ARGUMENT", ["total_bytes"]
        x = [copy(m) for m in chunks]
        x[0].ClearField("continuation")
        yield "no continuation", x, "INVALID_ARGUMENT", ["continuation"]

    for name, x, want, frags in cases():
        code, details, _ = import_(b, x, md)
        print("import with a bad %s: %s %s" % (name, code, details), flush=True)
        check(code == want and all(f in details for f in frags),
              "import with a bad %s: %s %s (want %s naming %s)" % (name, code, details, want,
                                                                    frags))
    bystander.wait()
    check(bystander.code == "OK" and bystander.tokens == ref.tokens,
          "the importer's running request is untouched: %s %s" % (bystander.code,
                                                                 bystander.details))
    code, details, _ = import_(b, chunks, md)
    check(code == "OK", "the intact snapshot still imports: %s %s" % (code, details))
    cont = run_all(b, {"snapshot_id": "no-such-snapshot"}, md)
    check(cont.code == "NOT_FOUND" and "no-such-snapshot" in cont.details,
          "Run with an unknown snapshot_id: %s %s" % (cont.code, cont.details))
    e2e.stop_all()


def case_bounds():
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    a = verifier(gw, "extra_buffer")
    b = verifier(gw, "replay", "--max-snapshots", "2", "--snapshot-ttl", "2s")
    st.wait_status(gw, lambda s: len(s.get("replicas", [])) >= 2, "two verifiers")
    base = {"prompt_ids": prompt(20, 9), "max_tokens": 300, "sampling": {"temperature": 0}}
    r = Runner(a, dict(base, request_id="src"))
    deadline = time.time() + 60
    while len(r.tokens) < 5 and r.code is None and time.time() < deadline:
        time.sleep(0.002)
    code, details, chunks = export(a, "src")
    check(code == "OK" and len(chunks) == 2, "export in one data chunk: %s %s %d" %
          (code, details, len(chunks)))
    r.wait()
    if code != "OK":
        return

    def renamed(name):
        x = [copy(m) for m in chunks]
        for m in x:
            m.snapshot_id = name
        return x

    codes = [import_(b, renamed("s%d" % i)) for i in range(3)]
    check(codes[0][0] == "OK" and codes[1][0] == "OK",
          "two imports within max_snapshots: %s" % [c[:2] for c in codes[:2]])
    check(codes[2][0] == "RESOURCE_EXHAUSTED" and "max_snapshots" in codes[2][1],
          "a third import beyond max_snapshots 2: %s %s" % codes[2][:2])
    code, details, _ = import_(b, renamed("s0"))
    check(code in ("ALREADY_EXISTS", "RESOURCE_EXHAUSTED"),
          "an id imported already: %s %s" % (code, details))
    first = run_all(b, {"snapshot_id": "s0"})
    check(first.code == "OK", "Run with s0: %s %s" % (first.code, first.details))
    again = run_all(b, {"snapshot_id": "s0"})
    check(again.code == "NOT_FOUND", "a snapshot continues once: %s %s" % (again.code,
                                                                          again.details))
    time.sleep(3.5)
    late = run_all(b, {"snapshot_id": "s1"})
    check(late.code == "NOT_FOUND" and "snapshot_ttl" in late.details,
          "Run after snapshot_ttl: %s %s" % (late.code, late.details))
    desc = "/tandem.v1.Verifier/Describe"
    check(e2e.counter(b.addr(), desc, "snapshots_expired") == 1 and
          e2e.counter(b.addr(), desc, "snapshots_imported") == 2 and
          e2e.counter(b.addr(), desc, "snapshots_waiting") == 0 and
          e2e.counter(a.addr(), desc, "snapshots_exported") == 1,
          "snapshot counters: expired %s, imported %s, waiting %s, exported %s" %
          (e2e.counter(b.addr(), desc, "snapshots_expired"),
           e2e.counter(b.addr(), desc, "snapshots_imported"),
           e2e.counter(b.addr(), desc, "snapshots_waiting"),
           e2e.counter(a.addr(), desc, "snapshots_exported")))
    # The expired one no longer counts against the bound.
    code, details, _ = import_(b, renamed("s3"))
    check(code == "OK", "an import after the others expired: %s %s" % (code, details))
    e2e.stop_all()


# CRC32C (Castagnoli), independent of the C code.
_CRC = []


def crc32c(data):
    if not _CRC:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _CRC[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


# ---- drain and failover through the gateway ---------------------------------------

class Stream:
    """A Generate stream read on a thread of its own."""

    def __init__(self, gw, req):
        grpc = grpc_mod()
        from google.protobuf import json_format
        self.json_format = json_format
        c = st.client()
        req_cls, resp_cls, _ = c._method("/tandem.v1.Gateway/Generate")
        self.ch = grpc.insecure_channel(gw.addr())
        fn = self.ch.unary_stream("/tandem.v1.Gateway/Generate",
                                  request_serializer=req_cls.SerializeToString,
                                  response_deserializer=resp_cls.FromString)
        self.call = fn(json_format.ParseDict(req, req_cls()), timeout=240)
        self.ids, self.done, self.code, self.details = [], None, None, ""
        self.t_end = None
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        grpc = grpc_mod()
        try:
            for m in self.call:
                d = self.json_format.MessageToDict(m, preserving_proto_field_name=True)
                if "tokens" in d:
                    self.ids += [int(x) for x in d["tokens"].get("ids", [])]
                if "complete" in d:
                    self.done = d["complete"]
            self.code = "OK"
        except grpc.RpcError as e:
            self.code, self.details = e.code().name, e.details() or ""
        self.t_end = time.time()

    def wait(self, timeout=240):
        self.t.join(timeout)
        self.ch.close()
        return self


def gen_req(i, n, **kw):
    """Request i of the drain and failover cases: greedy, seeded sampling,
    or speculating with fixed blocks (greedy or seeded)."""
    kind = kw.pop("kind", ("greedy", "seeded", "spec", "spec-seeded")[i % 4])
    r = {"token_ids": {"ids": prompt(24 + 3 * i, 20 + i)}, "max_tokens": n, "ignore_eos": True,
         "request_id": "r%d-%s" % (i, kind)}
    if kind in ("seeded", "spec-seeded"):
        r["sampling"] = {"temperature": 0.8, "top_p": 0.95, "seed": 4242 + i}
    else:
        r["sampling"] = {"temperature": 0}
    if kind.startswith("spec"):
        r["speculation"] = {"mode": "SPECULATION_MODE_ON", "block_size": 4,
                            "fixed_block_size": True}
    else:
        r["speculation"] = {"mode": "SPECULATION_MODE_OFF"}
    r.update(kw)
    return r


def references(gw, reqs):
    out = []
    for r in reqs:
        s = Stream(gw, dict(r, request_id=r["request_id"] + "-ref")).wait()
        check(s.code == "OK" and len(s.ids) == r["max_tokens"],
              "reference run of %s: %s %s, %d tokens" % (r["request_id"], s.code, s.details,
                                                        len(s.ids)))
        out.append(s.ids)
    return out


def wait_tokens(streams, n, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and not all(len(s.ids) >= n or s.code for s in streams):
        time.sleep(0.005)


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def case_drain():
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    d = st.replica("drafter", gw, "--model", e2e.DRAFTER, "--state-strategy", "replay",
                   "--draft-block-size", "4")
    a = verifier(gw, "replay", "--shutdown-grace", "20s")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 1, "verifier A paired")
    N = 400 if st.ARGS.quick else 800
    reqs = [gen_req(i, N) for i in range(8)]
    refs = references(gw, reqs)

    # Eight requests on A; B joins; A is told to drain.
    streams = [Stream(gw, r) for r in reqs]
    wait_tokens(streams, 16)
    b = verifier(gw, "extra_buffer")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 2, "verifier B paired")
    running = sum(1 for s in streams if s.code is None)
    t0 = time.time()
    a.p.send_signal(signal.SIGTERM)
    rc = a.p.wait(60)
    print("A drained and exited %d in %.2f s with %d of 8 requests running when told" %
          (rc, time.time() - t0, running), flush=True)
    check(rc == 0, "the drained verifier exits 0 (got %d)" % rc)
    check(running == 8, "all 8 requests were still running on A when it was told to drain "
          "(%d were)" % running)
    for s, r, ref in zip(streams, reqs, refs):
        s.wait()
        moves = (s.done or {}).get("stats", {}).get("moves", [])
        check(s.code == "OK" and s.ids == ref,
              "%s moved by the drain: %s %s, %d tokens, first difference at %d; moves %s" %
              (r["request_id"], s.code, s.details, len(s.ids), first_diff(s.ids, ref), moves))
        check(len(moves) == 1 and "snapshot" in moves[0] and moves[0].startswith(a_id(a)),
              "%s: stats say it moved by snapshot from A: %s" % (r["request_id"], moves))
    imported = e2e.counter(b.addr(), "/tandem.v1.Verifier/Describe", "snapshots_imported") or 0
    spec_b = e2e.counter(b.addr(), "/tandem.v1.Verifier/Describe", "speculative_rounds") or 0
    print("B imported %d snapshots and verified %d draft blocks" % (imported, spec_b), flush=True)
    check(imported == 8, "B imported the 8 snapshots (%d)" % imported)
    check(spec_b > 0, "speculation went on on B after the move")

    # `tandem drain` through the gateway: B's two requests move to C.
    c = verifier(gw, "no_buffer")
    # long enough to still run when C, started after them, has paired
    two = [gen_req(i, 3 * N, kind="greedy" if i == 0 else "spec") for i in range(2)]
    refs2 = references(gw, two)
    # Both on B: C must not take them; it joins after they started.
    c.stop(signal.SIGTERM)
    st.wait_status(gw, lambda s: len([x for x in s.get("replicas", [])
                                      if x["descriptor"]["role"] == "ROLE_VERIFIER"]) == 1,
                   "C gone")
    streams = [Stream(gw, r) for r in two]
    wait_tokens(streams, 16)
    c = verifier(gw, "no_buffer")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 2, "verifier C paired")
    out = st.run([ARGS_CLI(), "drain", "--gateway", gw.addr(), "--reason", "test",
                  a_id(b)])
    check(out[0] == 0 and "is draining" in out[1], "tandem drain %s: %s" % (a_id(b), out))
    rc = b.p.wait(60)
    check(rc == 0, "B, drained by tandem drain, exits 0 (got %d)" % rc)
    for s, r, ref in zip(streams, two, refs2):
        s.wait()
        moves = (s.done or {}).get("stats", {}).get("moves", [])
        check(s.code == "OK" and s.ids == ref and len(moves) == 1 and "snapshot" in moves[0],
              "%s after tandem drain: %s %s, first difference at %d; moves %s" %
              (r["request_id"], s.code, s.details, first_diff(s.ids, ref), moves))

    # A drafter drains (SIGTERM) mid-request: the request goes on without it.
    r = gen_req(0, N, kind="spec")
    ref = references(gw, [r])[0]
    s = Stream(gw, r)
    wait_tokens([s], 16)
    d.p.send_signal(signal.SIGTERM)
    rc = d.p.wait(60)
    s.wait()
    check(rc == 0, "the drained drafter exits 0 (got %d)" % rc)
    check(s.code == "OK" and s.ids == ref,
          "a request whose drafter drained: %s %s, first difference at %d" %
          (s.code, s.details, first_diff(s.ids, ref)))
    e2e.stop_all()


def a_id(v):
    """A verifier's replica id, from its start-up log."""
    import re
    m = re.search(r"serving \S+ as (\S+)", v.text())
    return m.group(1) if m else "?"


def ARGS_CLI():
    return st.ARGS.cli


def case_failover():
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    d = st.replica("drafter", gw, "--model", e2e.DRAFTER, "--state-strategy", "replay",
                   "--draft-block-size", "4")
    a = verifier(gw, "replay")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 1, "verifier A paired")
    N = 400 if st.ARGS.quick else 800
    reqs = [gen_req(i, N) for i in range(4)]
    refs = references(gw, reqs)
    streams = [Stream(gw, r) for r in reqs]
    wait_tokens(streams, 16)
    b = verifier(gw, "extra_buffer")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 2, "verifier B paired")
    at = [len(s.ids) for s in streams]
    a.p.send_signal(signal.SIGKILL)
    a.p.wait()
    print("killed A with %s tokens streamed" % at, flush=True)
    for s, r, ref in zip(streams, reqs, refs):
        s.wait()
        moves = (s.done or {}).get("stats", {}).get("moves", [])
        check(s.code == "OK" and s.ids == ref,
              "%s after its verifier was killed: %s %s, %d tokens, first difference at %d; "
              "moves %s" % (r["request_id"], s.code, s.details, len(s.ids),
                            first_diff(s.ids, ref), moves))
        check(len(moves) == 1 and "recomputed" in moves[0] and a_id(b) in moves[0],
              "%s: stats say it was recomputed on B: %s" % (r["request_id"], moves))

    # No spare verifier: UNAVAILABLE naming the cause, promptly.
    s = Stream(gw, gen_req(1, N))
    wait_tokens([s], 16)
    t0 = time.time()
    b.p.send_signal(signal.SIGKILL)
    b.p.wait()
    s.wait(60)
    took = time.time() - t0
    print("without a spare: %s after %.2f s: %s" % (s.code, took, s.details), flush=True)
    check(s.code == "UNAVAILABLE" and "no other verifier" in s.details and took < 5,
          "a request whose only verifier died: %s %s after %.1f s" % (s.code, s.details, took))
    del d
    e2e.stop_all()

CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    for a in ("cli", "gateway", "verifier", "drafter", "source"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--quick", action="store_true",
                    help="shorter requests to move (sanitizer builds, several times slower)")
    a = ap.parse_args()
    st.ARGS = a
    st.TMP = tempfile.mkdtemp(prefix="tandem-snapshot-")
    e2e.setup_paths()
    try:
        CASES[a.case]()
    finally:
        for p in reversed(st.PROCS):
            if p.p.poll() is None:
                p.p.send_signal(signal.SIGKILL)
                p.p.wait()
        if st.FAILURES:
            for p in st.PROCS:
                print("---- log of %s (%s)" % (p.name, p.log_path))
                print(p.text()[-4000:])
        st.remove_workdir()
    if st.FAILURES:
        print("%d check(s) failed" % len(st.FAILURES))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
