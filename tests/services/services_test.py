#!/usr/bin/python3
"""End-to-end tests of tandem-gateway, tandem-verifier and tandem-drafter as
real processes on loopback: registration, heartbeats and the TTL, the
compatibility rules between pairs, `tandem status`, `--check-config`,
`tandem check-config` offline, clean shutdown, and interop with an
independent gRPC implementation (Python grpcio, through tests/interop/client.py).

Expected values come from the issue and DESIGN.md (rule ids, which settings a
message names) and from independent references (the Python fingerprint
implementation in tests/compat/fingerprint_ref.py), never from the C code's
own output alone.

usage: services_test.py CASE --cli PATH --gateway PATH --verifier PATH --drafter PATH
                        --source ROOT
"""
import argparse
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

ARGS = None
TMP = None
FAILURES = []


def remove_workdir():
    """A passed case's work directory goes; a failed one's stays for its logs."""
    if FAILURES:
        print("work directory kept: %s" % TMP)
    else:
        shutil.rmtree(TMP, ignore_errors=True)


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what, flush=True)
    return cond


# ---- processes ---------------------------------------------------------------

class Proc:
    """A service process with its stderr in a file."""

    def __init__(self, name, binary, args, env=None, cpus=None):
        self.name = name
        self.log_path = os.path.join(TMP, "%s-%d.log" % (name, int(time.time() * 1e6)))
        self.log = open(self.log_path, "wb")
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("TANDEM_"):
                del e[k]
        e.update(env or {})
        # cpus: the CPUs it may run on (its affinity mask, as taskset sets it)
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.p = subprocess.Popen([binary] + args, stdout=self.log, stderr=self.log, env=e,
                                  preexec_fn=pin)
        self.port = None
        self.health_port = None

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_ready(self, timeout=15.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(r"bound port (\d+), health port (\d+)", self.text())
            if m:
                self.port, self.health_port = int(m.group(1)), int(m.group(2))
                return self
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit("FAIL: %s did not start (rc %s):\n%s" % (self.name, self.p.poll(),
                                                                   self.text()))

    def addr(self):
        return "127.0.0.1:%d" % self.port

    def stop(self, sig=signal.SIGTERM, timeout=20.0):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
            check(False, "%s did not exit within %ss of signal %d" % (self.name, timeout, sig))
        self.log.close()
        return rc


PROCS = []


def binary(name):
    return {"tandem": ARGS.cli, "tandem-gateway": ARGS.gateway, "tandem-verifier": ARGS.verifier,
            "tandem-drafter": ARGS.drafter}[name]


def start(role, *args, env=None, ready=True, cpus=None):
    p = Proc(role, binary("tandem-" + role),
             ["--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"] + list(args), env,
             cpus)
    PROCS.append(p)
    return p.wait_ready() if ready else p


def gateway(*args):
    return start("gateway", *args)


def replica(role, gw, *args, **kw):
    if role == "verifier" and "--model" not in args:
        args = ("--model", model("target", "f32_gqa", "qwen2_bpe1000")) + args
    return start(role, "--gateway", gw.addr(), *args, **kw)


def drafter_apart(gw, *args):
    """A drafter registered with gw in a mount namespace of its own with its
    own /dev/shm: on this host, but where a verifier's shared-memory segments
    cannot reach it, as on another host (needs unshare)."""
    p = Proc("drafter", shutil.which("unshare"),
             ["-rm", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"',
              ARGS.drafter, "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0",
              "--gateway", gw.addr()] + list(args))
    PROCS.append(p)
    return p.wait_ready()


def run(cmd, env=None):
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("TANDEM_"):
            del e[k]
    e.update(env or {})
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=60)
    return r.returncode, r.stdout, r.stderr


# ---- gRPC from Python ---------------------------------------------------------

_CLIENT = []


def client():
    if not _CLIENT:
        sys.path.insert(0, os.path.join(ARGS.source, "tests", "interop"))
        import client as c  # noqa: E402  (tests/interop/client.py)
        os.makedirs(os.path.join(TMP, "pb"), exist_ok=True)
        c.load_messages(ARGS.source, workdir=os.path.join(TMP, "pb"))
        _CLIENT.append(c)
    return _CLIENT[0]


class DraftStream:
    """A Draft stream to the drafter at addr with this client in the
    verifier's place: put() sends a DraftRequest (req_cls builds them),
    iterating `responses` reads the DraftResponses as they come; close()
    (or leaving a with block) ends the stream."""

    def __init__(self, addr, timeout=60):
        import queue
        import grpc
        self.req_cls, _, _ = client()._method("/tandem.v1.Drafter/Draft")
        sym = __import__("google.protobuf.symbol_database", fromlist=["x"]).Default()
        resp_cls = sym.GetSymbol("tandem.v1.DraftResponse")
        self._q = queue.Queue()

        def gen():
            while True:
                m = self._q.get()
                if m is None:
                    return
                yield m

        self._ch = grpc.insecure_channel(addr)
        self.responses = self._ch.stream_stream(
            "/tandem.v1.Drafter/Draft", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=resp_cls.FromString)(gen(), timeout=timeout)

    def put(self, m):
        self._q.put(m)

    def close(self):
        self._q.put(None)
        self.responses.cancel()
        self._ch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def unary(target, path, request=None, timeout=5.0):
    c = client()
    ch = c.channel(target)
    try:
        code, details, resp = c.call_unary(ch, path, request or {}, timeout)
    finally:
        ch.close()
    return code, details, (resp[0] if resp else None)


def counters(target, path):
    """A Describe's counters (path: the service's Describe method), by name."""
    code, details, resp = unary(target, path)
    check(code == "OK", "%s: %s %s" % (path, code, details))
    return {c["name"]: float(c["value"]) for c in (resp or {}).get("counters", [])}


def generate(gw, req, timeout=120.0):
    """Gateway.Generate with the request dict req, to its end: (code, details,
    ids, text, complete), complete None when no GenerateComplete came."""
    c = client()
    ch = c.channel(gw.addr())
    try:
        code, details, msgs = c.call_stream(ch, "/tandem.v1.Gateway/Generate", req, timeout)
    finally:
        ch.close()
    ids, text, done = [], "", None
    for m in msgs:
        if "tokens" in m:
            ids += [int(x) for x in m["tokens"]["ids"]]
            text += m["tokens"].get("text", "")
        if "complete" in m:
            done = m["complete"]
    return code, details, ids, text, done


def softmax_topk(logits, k, temperature=1.0):
    """The distribution sampling gives a row of logits under top-k (ties to
    the lower id), as {token: probability}."""
    idx = sorted(range(len(logits)), key=lambda i: (-logits[i], i))[:k]
    m = max(logits[i] for i in idx)
    e = [math.exp((logits[i] - m) / temperature) for i in idx]
    return {i: x / sum(e) for i, x in zip(idx, e)}


def chi_square(expect, counts, n):
    """Pearson's statistic of counts (outcome: observed, n in all) against
    expect (outcome: probability), cells expected below 5 pooled; returns
    (chi2, df, the 0.001 upper critical value by Wilson-Hilferty)."""
    chi, cells, pool_e, pool_o = 0.0, 0, 0.0, 0
    for k, p in expect.items():
        e, o = p * n, counts.get(k, 0)
        if e < 5:
            pool_e += e
            pool_o += o
            continue
        chi += (o - e) ** 2 / e
        cells += 1
    if pool_e >= 5:
        chi += (pool_o - pool_e) ** 2 / pool_e
        cells += 1
    df = cells - 1
    h = 2.0 / (9.0 * df)
    return chi, df, df * (1 - h + 3.090 * math.sqrt(h)) ** 3


def status(gw):
    code, details, resp = unary(gw.addr(), "/tandem.v1.Gateway/GetStatus")
    if not check(code == "OK", "GetStatus: %s %s" % (code, details)):
        return {"replicas": [], "pairs": [], "replica_refusals": []}
    return resp


def wait_status(gw, pred, what, timeout=15.0):
    deadline = time.time() + timeout
    s = None
    while time.time() < deadline:
        s = status(gw)
        if pred(s):
            return s
        time.sleep(0.1)
    check(False, "timed out waiting for: %s; last status: %s" % (what, json.dumps(s)[:3000]))
    return s


def replica_ids(s):
    return sorted(r["descriptor"]["replica_id"] for r in s.get("replicas", []))


def pair(s, v, d):
    for p in s.get("pairs", []):
        if p["verifier"] == v and p["drafter"] == d:
            return p
    return None


# ---- fixtures -----------------------------------------------------------------

def tokenizer(name):
    """Extracts tests/fixtures/tokenizer/<name>.tokenizer.json (trained by HF)."""
    out = os.path.join(TMP, "tok-" + name + ".json")
    if not os.path.exists(out):
        with tarfile.open(os.path.join(ARGS.source, "tests/fixtures/tokenizer/fixtures.tar.gz")) as t:
            f = t.extractfile(name + ".tokenizer.json")
            with open(out, "wb") as o:
                o.write(f.read())
    return out


def model(name, fixture, tok):
    """A model directory: a transformers-saved fixture model plus a tokenizer."""
    d = os.path.join(TMP, name)
    if not os.path.isdir(d):
        os.makedirs(d)
        src = os.path.join(ARGS.source, "tests/fixtures/engine", fixture, "model")
        for f in os.listdir(src):
            os.symlink(os.path.join(src, f), os.path.join(d, f))
        if tok:
            shutil.copy(tokenizer(tok), os.path.join(d, "tokenizer.json"))
    return d


def reference():
    sys.path.insert(0, os.path.join(ARGS.source, "tests", "compat"))
    import fingerprint_ref  # noqa: E402
    return fingerprint_ref


def write(name, text):
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        f.write(text)
    return p


# ---- cases --------------------------------------------------------------------

def case_pair_formed():
    tok = "qwen2_bpe1000"
    vm = model("target", "f32_gqa", tok)
    dm = model("draft", "f32_tied", tok)
    gw = gateway("--heartbeat-interval", "200ms")
    v = replica("verifier", gw, "--model", vm, "--replica-id", "v1", "--max-draft-tokens", "6")
    # the drafter on one of the verifier's CPUs: they share cores
    d = replica("drafter", gw, "--model", dm, "--replica-id", "d1", "--draft-block-size", "6",
                cpus=[sorted(os.sched_getaffinity(0))[-1]])
    s = wait_status(gw, lambda s: pair(s, "v1", "d1") is not None, "pair v1+d1")
    p = pair(s, "v1", "d1")
    check(p is not None and p["compatible"] and not p["refusals"],
          "v1+d1 compatible: %s" % json.dumps(p))
    ref = reference()
    want_tok = ref.tokenizer_fp(tokenizer(tok))
    for r in s["replicas"]:
        dd = r["descriptor"]
        check(dd["tokenizer_fingerprint"] == want_tok,
              "%s tokenizer fingerprint %s, reference %s" % (dd["replica_id"],
                                                             dd["tokenizer_fingerprint"], want_tok))
        want_model = ref.model_fp(vm if dd["replica_id"] == "v1" else dm)
        check(dd["model_fingerprint"] == want_model,
              "%s model fingerprint %s, reference %s" % (dd["replica_id"], dd["model_fingerprint"],
                                                         want_model))
        check(dd["protocol"]["major"] == 1, "protocol major 1")
        check(dd["snapshot_layout_version"] == 1, "snapshot layout 1")
        check(dd["build"]["version"] == "0.1.0", "build version")
        check(r["heartbeat_age_ms"] < 5000, "heartbeat age %s" % r["heartbeat_age_ms"])
        check(dd["address"] == (v.addr() if dd["replica_id"] == "v1" else d.addr()),
              "advertised address %s has the bound port" % dd["address"])
    byid = {r["descriptor"]["replica_id"]: r["descriptor"] for r in s["replicas"]}
    check(byid["v1"]["role"] == "ROLE_VERIFIER" and byid["v1"]["max_draft_tokens"] == 6,
          "verifier descriptor")
    check(byid["d1"]["role"] == "ROLE_DRAFTER" and byid["d1"]["draft_block_size"] == 6 and
          byid["d1"]["drafter_kind"] == "DRAFTER_KIND_MODEL", "drafter descriptor")
    with open(os.path.join(vm, "config.json")) as f:
        want_vocab = json.load(f)["vocab_size"]
    check(byid["v1"]["model_name"] == "target" and byid["v1"]["vocab_size"] == want_vocab,
          "model name and vocab size from config.json: %s" % byid["v1"])
    check(byid["v1"]["state_strategy"] == "STATE_STRATEGY_EXTRA_BUFFER", "state strategy")
    # Where each computes: the host (the kernel's boot_id) and its process's
    # CPUs, the affinity mask as a CPU list.
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot_id = f.read().strip()
    for rid, proc in (("v1", v), ("d1", d)):
        mask = sorted(os.sched_getaffinity(proc.p.pid))
        runs = []
        for c in mask:
            if runs and runs[-1][1] == c - 1:
                runs[-1][1] = c
            else:
                runs.append([c, c])
        want = ",".join("%d" % a if a == b else "%d-%d" % (a, b) for a, b in runs)
        check(byid[rid].get("host_id") == boot_id and byid[rid].get("cpus") == want,
              "%s: host_id %s cpus %s, want %s and %s" % (rid, byid[rid].get("host_id"),
                                                        byid[rid].get("cpus"), boot_id, want))
    # The gateway's effective configuration with provenance.
    cfg = {e["key"]: e for e in s["config"]["entries"]}
    check(cfg["heartbeat_interval"]["value"] == "200ms" and
          cfg["heartbeat_interval"]["source"] == "flag:--heartbeat-interval",
          "config entry with source: %s" % cfg.get("heartbeat_interval"))
    check(any(c["name"] == "registrations" and c["value"] >= 2 for c in s["counters"]),
          "registration counter")
    # `tandem status`, readable and JSON.
    rc, out, err = run([binary("tandem"), "status", "--gateway", gw.addr()])
    check(rc == 0, "tandem status rc %d: %s" % (rc, err))
    check("pairs formed (1):" in out and "verifier v1 + drafter d1" in out,
          "tandem status shows the pair:\n" + out)
    check("pairs refused (0):" in out, "no refusals:\n" + out)
    check("on CPU cores they may share (CPUs %s and %s)" % (byid["v1"]["cpus"],
                                                           byid["d1"]["cpus"]) in out and
          "CPUs %s of host %s" % (byid["d1"]["cpus"], boot_id) in out,
          "tandem status says where they compute:\n" + out)
    rc, out, err = run([binary("tandem"), "status", "--gateway", gw.addr(), "--json"])
    j = json.loads(out) if rc == 0 else {}
    check(rc == 0 and len(j.get("replicas", [])) == 2 and j["pairs"][0]["compatible"] is True,
          "tandem status --json: %s" % out[:500])
    rc, out, err = run([binary("tandem"), "status", "--gateway", "127.0.0.1:1", "--timeout", "1s"])
    check(rc != 0 and "127.0.0.1:1" in err and "UNAVAILABLE" in err,
          "status against nothing fails clearly: %s" % err)
    # Logs: pair formed once.
    time.sleep(0.5)
    check(gw.text().count("pair formed: verifier v1 + drafter d1") == 1, "pair formed logged once")
    # The CPU backend starts one worker per CPU the process may run on (its
    # affinity mask: taskset, a container's cpuset), not the host's count.
    cpus = sorted(os.sched_getaffinity(0))
    n = len(cpus)
    check("%d worker%s" % (n, "" if n == 1 else "s") in v.text(),
          "the verifier runs %d CPU workers:\n%s" % (n, v.text()[-2000:]))
    pinned = Proc("verifier", shutil.which("taskset"),
                  ["-c", str(cpus[0]), ARGS.verifier, "--listen", "127.0.0.1:0",
                   "--health-listen", "127.0.0.1:0", "--gateway", gw.addr(), "--model", vm,
                   "--replica-id", "v-pinned"])
    PROCS.append(pinned)
    pinned.wait_ready()
    check("; 1 worker)" in pinned.text(),
          "a verifier pinned to one CPU runs one worker:\n%s" % pinned.text()[-2000:])


def build_protocol():
    """'major.minor' of the protocol this tree speaks (common/buildinfo.h)."""
    with open(os.path.join(ARGS.source, "common", "buildinfo.h")) as f:
        text = f.read()
    return "%s.%s" % (re.search(r"TDM_PROTOCOL_MAJOR (\d+)", text).group(1),
                      re.search(r"TDM_PROTOCOL_MINOR (\d+)", text).group(1))


def fake_descriptor(rid, role, **kw):
    d = {"role": role, "replica_id": rid, "address": "10.9.9.9:1", "protocol": {"major": 1},
         "snapshot_layout_version": 1, "state_strategy": "STATE_STRATEGY_EXTRA_BUFFER",
         "instance_id": "fake-" + rid}
    d.update(kw)
    return d


def case_refusals():
    gw = gateway("--replica-ttl", "60s")
    tok_a = "qwen2_bpe1000"
    v = replica("verifier", gw, "--model", model("target", "f32_gqa", tok_a), "--replica-id",
                "v1", "--max-draft-tokens", "8")
    # A model drafter with another tokenizer.
    replica("drafter", gw, "--model", model("draft-b", "f32_tied", "gpt2_bpe2000"),
            "--replica-id", "d-tok")
    # A block larger than the verifier's max_draft_tokens.
    replica("drafter", gw, "--replica-id", "d-block", "--draft-block-size", "12")
    # Settings a correctly configured tandem process refuses to start with come
    # from peers of other builds: registered here directly from Python.
    fp = reference().tokenizer_fp(tokenizer(tok_a))
    fakes = [
        fake_descriptor("d-prefix", "ROLE_DRAFTER", draft_block_size=4, prefix_cache=True,
                        state_strategy="STATE_STRATEGY_NO_BUFFER", tokenizer_fingerprint=fp,
                        drafter_kind="DRAFTER_KIND_MODEL"),
        fake_descriptor("d-proto", "ROLE_DRAFTER", draft_block_size=4, protocol={"major": 2},
                        tokenizer_fingerprint=fp, drafter_kind="DRAFTER_KIND_MODEL"),
        fake_descriptor("v-layout", "ROLE_VERIFIER", max_draft_tokens=8,
                        snapshot_layout_version=2, tokenizer_fingerprint=fp),
    ]
    for f in fakes:
        code, details, resp = unary(gw.addr(), "/tandem.v1.Registry/RegisterReplica",
                                    {"descriptor": f})
        check(code == "OK", "fake registration %s: %s %s" % (f["replica_id"], code, details))
        if f["replica_id"] == "d-prefix":
            check(any(r["rule"] == "prefix-cache-state" for r in resp["refusals"]),
                  "RegisterResponse lists the refusal: %s" % resp)
    s = wait_status(gw, lambda s: len(s["replicas"]) == 6, "6 replicas")
    expect = {
        "d-tok": ("tokenizer-fingerprint", [reference().tokenizer_fp(tokenizer(tok_a))[:12],
                                            reference().tokenizer_fp(tokenizer("gpt2_bpe2000"))[:12]]),
        "d-block": ("draft-block-size", ["blocks of 12 tokens", "at most 8 draft tokens"]),
        "d-prefix": ("prefix-cache-state", ["prefix_cache=on, state_strategy=no_buffer"]),
        "d-proto": ("protocol-major", ["protocol " + build_protocol(), "protocol 2.0"]),
    }
    for did, (rule, words) in expect.items():
        p = pair(s, "v1", did)
        if not check(p is not None, "pair v1+%s listed" % did):
            continue
        check(not p["compatible"], "v1+%s refused" % did)
        rules = [r["rule"] for r in p["refusals"]]
        check(rules == [rule], "v1+%s refused by %s only, got %s" % (did, rule, rules))
        if p["refusals"]:
            r = p["refusals"][0]
            msg = r["message"]
            check(msg.startswith("rule " + rule + ":"), "message names the rule: " + msg)
            check("v1 (%s)" % v.addr() in msg, "message names the verifier: " + msg)
            check(did + " (" in msg, "message names the drafter: " + msg)
            for w in words:
                check(w in msg, "message of %s contains %r: %s" % (rule, w, msg))
            check(r["a_value"] and r["b_value"], "both values filled: %s" % r)
            check(gw.text().count(msg) == 1, "refusal logged once: " + msg)
            check(("WARN  registry: pair refused: " + msg) in gw.text(), "logged at WARN")
    # The layout mismatch is between replicas of one role.
    lr = [r for r in s["replica_refusals"] if r["rule"] == "snapshot-layout"]
    check(len(lr) == 1 and "v1" in lr[0]["message"] and "v-layout" in lr[0]["message"],
          "snapshot-layout refusal: %s" % s["replica_refusals"])
    # The layout verifier still pairs with compatible drafters? None here is
    # compatible with it either (same drafters) - but d-block is refused by its
    # own rule, not by the layout rule.
    p = pair(s, "v-layout", "d-block")
    check(p and [r["rule"] for r in p["refusals"]] == ["draft-block-size"],
          "pair rules do not include same-role rules: %s" % p)
    # `tandem status` prints the reasons.
    rc, out, err = run([binary("tandem"), "status", "--gateway", gw.addr()])
    check(rc == 0 and "rule draft-block-size:" in out and "rule tokenizer-fingerprint:" in out
          and "rule prefix-cache-state:" in out and "rule protocol-major:" in out and
          "rule snapshot-layout:" in out, "tandem status prints every refusal:\n" + out)
    # Bad registrations are rejected with INVALID_ARGUMENT and the gateway goes on.
    for bad, word in [({}, "descriptor is missing"),
                      ({"descriptor": fake_descriptor("g", "ROLE_GATEWAY")}, "role"),
                      ({"descriptor": fake_descriptor("has space", "ROLE_DRAFTER")}, "replica_id"),
                      ({"descriptor": fake_descriptor("", "ROLE_DRAFTER")}, "replica_id"),
                      ({"descriptor": fake_descriptor("x", "ROLE_DRAFTER", address="")},
                       "address"),
                      # A C string would have cut the id to "d1" without a word.
                      ({"descriptor": fake_descriptor("d1\0x", "ROLE_DRAFTER")},
                       "tandem.v1.Descriptor.replica_id holds a NUL character"),
                      # what a draft costs the drafter, which verifiers' rules start from
                      ({"descriptor": fake_descriptor("x", "ROLE_DRAFTER", draft_pass_costs=[
                          {"sequences": 1, "block": 4, "millis": 0.5},
                          {"sequences": 2, "block": 4, "millis": -1}])},
                       "descriptor.draft_pass_costs[1]: 2 sequences, block 4, -1 ms is out of range"),
                      ({"descriptor": fake_descriptor("x", "ROLE_DRAFTER", draft_pass_costs=[
                          {"sequences": 1, "block": 4, "millis": "NaN"}])},
                       "descriptor.draft_pass_costs[0]"),
                      ({"descriptor": fake_descriptor("x", "ROLE_DRAFTER", draft_pass_costs=[
                          {"sequences": 0, "block": 4, "millis": 1}])},
                       "descriptor.draft_pass_costs[0]: 0 sequences"),
                      ({"descriptor": fake_descriptor("x", "ROLE_DRAFTER", draft_pass_costs=[
                          {"sequences": 1, "block": 4, "millis": 1}] * 9)},
                       "descriptor.draft_pass_costs has 9 entries, at most 8"),
                      # what its drafts come from, and with
                      ({"descriptor": fake_descriptor("x", "ROLE_DRAFTER", weights="fp4")},
                       "descriptor.weights must be empty, checkpoint or fp8, got 'fp4'"),
                      ({"descriptor": fake_descriptor("x", "ROLE_DRAFTER", vocab_size=100,
                                                      draft_vocab_size=101)},
                       "descriptor.draft_vocab_size 101 exceeds its vocab_size 100")]:
        code, details, _ = unary(gw.addr(), "/tandem.v1.Registry/RegisterReplica", bad)
        check(code == "INVALID_ARGUMENT" and word in details,
              "bad registration %s -> %s %s" % (bad, code, details))
    check(len(status(gw)["replicas"]) == 6, "still serving after bad input")
    code, _, resp = unary(gw.addr(), "/tandem.v1.Registry/Heartbeat", {"replica_id": "nobody"})
    check(code == "OK" and resp["known"] is False, "heartbeat of an unknown replica: known=false")
    # A service given a port another one serves does not start beside it
    # (gRPC would share it by SO_REUSEPORT, each taking some of the other's
    # calls): it stops naming the address, and the first goes on serving.
    d = Proc("drafter", binary("tandem-drafter"),
             ["--listen", gw.addr(), "--health-listen", "127.0.0.1:0", "--gateway", gw.addr()])
    PROCS.append(d)
    try:
        rc = d.p.wait(30)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 1 and "cannot listen on '%s'" % gw.addr() in d.text(),
          "a drafter on the gateway's port: rc %s\n%s" % (rc, d.text()))
    check(len(status(gw)["replicas"]) == 6, "the gateway serves on after the clash")


def case_ttl():
    # Short enough for a quick test, long enough that a loaded CI machine
    # (ASan, parallel tests) does not miss ten heartbeats in a row.
    gw = gateway("--heartbeat-interval", "200ms", "--replica-ttl", "2s")
    replica("verifier", gw, "--replica-id", "v1")
    d = replica("drafter", gw, "--replica-id", "d1")
    wait_status(gw, lambda s: replica_ids(s) == ["d1", "v1"], "both registered")
    d.p.kill()  # SIGKILL: no deregistration
    d.p.wait()
    t0 = time.time()
    s = wait_status(gw, lambda s: replica_ids(s) == ["v1"], "d1 dropped after the TTL", 10)
    elapsed = time.time() - t0
    check(1.0 <= elapsed <= 6.0, "dropped after about the TTL (2s): %.2fs" % elapsed)
    check(re.search(r"WARN  registry: drafter d1 \(127\.0\.0\.1:\d+\) dropped: no heartbeat for "
                    r"\d+ ms \(replica_ttl 2000 ms\)", gw.text()) is not None,
          "drop logged at WARN naming the replica and TTL")
    # The verifier, still heartbeating, stays well past the TTL.
    time.sleep(2.5)
    check(replica_ids(status(gw)) == ["v1"], "a heartbeating replica is kept")
    check(any(c["name"] == "replicas_dropped" and c["value"] == 1 for c in status(gw)["counters"]),
          "dropped counter")


def case_heartbeat_cadence():
    """Heartbeats keep their cadence against a slow gateway: each starts an
    interval after the previous one started (not after it returned), and a
    failed one is tried again a quarter second later, not a whole interval
    later. A Python registry asks for one a second, answers each after
    600 ms, and fails the 3rd at once (UNAVAILABLE, as a restarting gateway
    does)."""
    import grpc
    from concurrent import futures
    c = client()
    arrivals = []
    handlers = {}
    for meth in ("RegisterReplica", "Heartbeat", "DeregisterReplica"):
        req_cls, resp_cls, _ = c._method("/tandem.v1.Registry/" + meth)

        def handle(req, ctx, meth=meth, resp_cls=resp_cls):
            resp = resp_cls()
            if meth == "RegisterReplica":
                resp.replica_id = req.descriptor.replica_id
                resp.heartbeat_interval_ms = 1000
                resp.ttl_ms = 10000
            elif meth == "Heartbeat":
                arrivals.append(time.monotonic())
                if len(arrivals) == 3:
                    ctx.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
                time.sleep(0.6)
                resp.known = True
            return resp
        handlers[meth] = grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=req_cls.FromString,
            response_serializer=resp_cls.SerializeToString)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("tandem.v1.Registry",
                                                                          handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        v = replica("verifier", Fake("127.0.0.1:%d" % port), "--replica-id", "v1")
        deadline = time.time() + 20
        while len(arrivals) < 7 and time.time() < deadline:
            time.sleep(0.05)
        gaps = [round(b - a, 3) for a, b in zip(arrivals, arrivals[1:])]
        check(len(gaps) >= 6, "heartbeats arrived: %s" % gaps)
        # An interval between starts, whatever the answer took; 250 ms after
        # the failed 3rd.
        want = [1.0, 1.0, 0.25, 1.0, 1.0, 1.0]
        check(all(abs(g - w) < 0.2 for g, w in zip(gaps, want)),
              "heartbeat gaps %s s, expected about %s" % (gaps[:6], want))
        check("heartbeat to gateway" in v.text() and "failed" in v.text(),
              "the failed heartbeat is logged")
    finally:
        for p in PROCS:
            if p.p.poll() is None:
                p.stop(signal.SIGKILL)
        server.stop(0)


def case_timing_lock():
    """Replicas of one host time their steps one at a time: a verifier and a
    model drafter started while another process holds the host's timing lock
    (/dev/shm/tandem-timing-cpu.lock, as a replica holds it while it times)
    wait for it, say so, and time after it is released; the lock file is one
    every user of the host can take."""
    import fcntl
    path = "/dev/shm/tandem-timing-cpu.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    gw = gateway()
    m = model("target", "f32_gqa", "qwen2_bpe1000")
    v = start("verifier", "--gateway", gw.addr(), "--replica-id", "v1", "--model", m,
              ready=False)
    d = start("drafter", "--gateway", gw.addr(), "--replica-id", "d1", "--model", m,
              ready=False)
    time.sleep(1.5)
    held = [p.name for p in (v, d) if re.search(r"steps timed|draft passes timed",
                                                 p.text())]
    check(not held, "nothing times while the lock is held: %s timed" % held)
    released = time.time()
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    v.wait_ready()
    d.wait_ready()
    wait_status(gw, lambda s: replica_ids(s) == ["d1", "v1"], "both registered")
    for p, what in ((v, r"steps timed in"), (d, r"draft passes timed in")):
        # The line is logged once the lock is taken: after the release (a
        # process that started late under load waited less than the 1.5 s).
        waited = re.search(r"^(\S+) INFO  (verifier|drafter): waited (\d+) ms for another "
                           r"process on this host to finish timing \(%s\)$" % re.escape(path),
                           p.text(), re.M)
        at = waited and datetime.datetime.strptime(waited.group(1), "%Y-%m-%dT%H:%M:%S.%fZ")
        at = at and at.replace(tzinfo=datetime.timezone.utc).timestamp()
        check(waited and int(waited.group(3)) > 0 and at >= released - 0.002,
              "%s says it waited for the lock until its release (%.3f): %s" %
              (p.name, released, waited and waited.group(0)))
        check(re.search(what, p.text()), "%s timed after the release" % p.name)
    check(oct(os.stat(path).st_mode & 0o777) == "0o666", "the lock file is 0666: %s" %
          oct(os.stat(path).st_mode & 0o777))
    # Unheld, nobody waits long: a third replica starts and times at once.
    v2 = replica("verifier", gw, "--replica-id", "v2", "--model", m)
    wait_status(gw, lambda s: "v2" in replica_ids(s), "v2 registered")
    w = re.search(r"waited (\d+) ms for another process", v2.text())
    check(not w or int(w.group(1)) < 1000, "an unheld lock is taken at once: %s" %
          (w and w.group(0)))
    # A link in its place (/dev/shm is everyone's) is not followed: the
    # replica times without the lock and leaves the link's target alone.
    target = os.path.join(TMP, "not-a-lock")
    with open(target, "w") as f:
        f.write("keep")
    os.chmod(target, 0o600)
    os.unlink(path)
    os.symlink(target, path)
    try:
        v3 = replica("verifier", gw, "--replica-id", "v3", "--model", m, "--log-level", "debug")
        wait_status(gw, lambda s: "v3" in replica_ids(s), "v3 registered")
        check(re.search(r"timing without the host's timing lock: %s: " % re.escape(path),
                        v3.text()), "a link at the lock's path is not followed")
        check(oct(os.stat(target).st_mode & 0o777) == "0o600" and open(target).read() == "keep",
              "the link's target is left as it was")
    finally:
        os.unlink(path)


class Fake:
    """An address that replica() can register with."""

    def __init__(self, addr):
        self._addr = addr

    def addr(self):
        return self._addr


def case_reregister():
    # A replica started before its gateway retries until the gateway is up.
    import socket
    sk = socket.socket()
    sk.bind(("127.0.0.1", 0))
    port = sk.getsockname()[1]
    sk.close()
    addr = "127.0.0.1:%d" % port
    v = start("verifier", "--gateway", addr, "--replica-id", "v1", "--model",
              model("target", "f32_gqa", "qwen2_bpe1000"))
    time.sleep(1.0)
    check("cannot register with gateway %s" % addr in v.text(), "retrying is logged")
    check(v.text().count("cannot register with gateway") == 1, "warned once per outage")
    gw = Proc("gateway", binary("tandem-gateway"),
              ["--listen", addr, "--health-listen", "127.0.0.1:0", "--heartbeat-interval",
               "100ms", "--replica-ttl", "2s"])
    PROCS.append(gw)
    gw.wait_ready()
    wait_status(gw, lambda s: replica_ids(s) == ["v1"], "v1 registered after the gateway came up",
                12)
    # A restarted gateway has forgotten everyone: the replica registers again
    # when its heartbeat answers known=false.
    check(gw.stop() == 0, "gateway exits 0")
    gw2 = Proc("gateway", binary("tandem-gateway"),
               ["--listen", addr, "--health-listen", "127.0.0.1:0", "--heartbeat-interval",
                "100ms", "--replica-ttl", "2s"])
    PROCS.append(gw2)
    gw2.wait_ready()
    wait_status(gw2, lambda s: replica_ids(s) == ["v1"], "v1 registered again", 12)
    code, _, desc = unary(v.addr(), "/tandem.v1.Verifier/Describe")
    counters = {c["name"]: c["value"] for c in desc["counters"]} if desc else {}
    check(counters.get("registrations", 0) >= 2, "registered twice: %s" % counters)
    check(counters.get("forgotten_by_gateway", 0) >= 1 or "registering again" in v.text() or
          counters.get("registrations", 0) >= 2, "re-registration after known=false")


def case_sigterm():
    gw = gateway("--replica-ttl", "60s")
    v = replica("verifier", gw, "--replica-id", "v1")
    d = replica("drafter", gw, "--replica-id", "d1")
    wait_status(gw, lambda s: replica_ids(s) == ["d1", "v1"], "both registered")
    check(v.stop(signal.SIGTERM) == 0, "verifier exits 0 on SIGTERM")
    # Deregistration, not the (60 s) TTL, removes it.
    s = wait_status(gw, lambda s: replica_ids(s) == ["d1"], "v1 deregistered", 5)
    check("verifier v1 (%s) deregistered: shutting down" % v.addr() in gw.text(),
          "deregistration logged")
    check(d.stop(signal.SIGINT) == 0, "drafter exits 0 on SIGINT")
    wait_status(gw, lambda s: replica_ids(s) == [], "d1 deregistered", 5)
    # A health watcher on the probe port sees SERVING, then NOT_SERVING when
    # the gateway drains.
    import threading
    c = client()
    result = {}

    def watch():
        ch = c.channel("127.0.0.1:%d" % gw.health_port)
        result["r"] = c.call_stream(ch, "/grpc.health.v1.Health/Watch", {"service": ""},
                                    timeout=15.0, max_messages=2)
        ch.close()

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(0.5)
    check(gw.stop(signal.SIGTERM) == 0, "gateway exits 0 on SIGTERM")
    t.join(20)
    code, details, msgs = result.get("r", ("none", "", []))
    statuses = [m["status"] for m in msgs]
    check(statuses[:2] == ["SERVING", "NOT_SERVING"],
          "Watch during drain: %s (%s %s)" % (statuses, code, details))


def case_check_config():
    v = binary("tandem-verifier")
    m = model("target", "f32_gqa", "qwen2_bpe1000")
    # A refused conflict and a resolved auto (a verifier also needs its model).
    rc, out, err = run([v, "--check-config", "--prefix-cache", "on", "--state-strategy",
                        "no_buffer", "--model", m])
    check(rc != 0, "conflict exits non-zero")
    check("prefix_cache=on (flag:--prefix-cache)" in out and
          "state_strategy=no_buffer (flag:--state-strategy)" in out,
          "conflict names both settings, values and sources:\n" + out)
    rc, out, err = run([v, "--check-config", "--prefix-cache", "on", "--state-strategy", "auto",
                        "--model", m])
    check(rc == 0, "auto resolves: rc %d\n%s%s" % (rc, out, err))
    line = [ln for ln in out.splitlines() if ln.startswith("state_strategy:")]
    check(len(line) == 1 and "extra_buffer" in line[0] and
          "rule state-strategy-for-prefix-cache" in line[0] and
          "prefix_cache=on (flag:--prefix-cache)" in line[0],
          "state_strategy line says extra_buffer and why: %s" % line)
    # The same conflict from env and file, without --check-config: no start.
    f = write("v-conflict.yaml", "# verifier\nstate_strategy: no_buffer\n")
    rc, out, err = run([v, "--config", f, "--listen", "127.0.0.1:0", "--health-listen",
                        "127.0.0.1:0", "--model", m], env={"TANDEM_PREFIX_CACHE": "on"})
    check(rc == 2, "refuses to start: rc %d" % rc)
    check("prefix_cache=on (env:TANDEM_PREFIX_CACHE)" in err and
          ("state_strategy=no_buffer (file:%s:2)" % f) in err, "names env and file:line:\n" + err)
    check("listening" not in err, "did not serve")
    # Every value's source is printed.
    rc, out, err = run([v, "--check-config", "--config", write("v.yaml", "max_draft_tokens: 5\n"),
                        "--log-level", "warn"], env={"TANDEM_MAX_SEQUENCES": "32",
                                                     "TANDEM_MODEL": m})
    check(rc == 0, "valid config: %s" % out)
    check(re.search(r"^max_draft_tokens: +5 +# file:.*v\.yaml:1$", out, re.M) is not None,
          "file source:\n" + out)
    check(re.search(r"^max_sequences: +32 +# env:TANDEM_MAX_SEQUENCES$", out, re.M) is not None,
          "env source:\n" + out)
    check(re.search(r"^log_level: +warn +# flag:--log-level$", out, re.M) is not None,
          "flag source:\n" + out)
    check(re.search(r"^gateway: +127\.0\.0\.1:7700 +# default$", out, re.M) is not None,
          "default source:\n" + out)
    # A misspelt environment variable is reported; another service's is not.
    rc, out, err = run([v, "--check-config", "--model", m],
                       env={"TANDEM_MAX_DRAFT_TOKEN": "3", "TANDEM_DRAFT_BLOCK_SIZE": "4"})
    check(rc == 0 and "warning: environment variable TANDEM_MAX_DRAFT_TOKEN is not a setting"
          in out and "TANDEM_DRAFT_BLOCK_SIZE" not in out, "unknown env var warned:\n" + out)
    # Unknown keys in files and bad values.
    bad = write("bad.yaml", "listen: 127.0.0.1:0\nmax_draft_tokenz: 4\n")
    rc, out, err = run([v, "--check-config", "--config", bad, "--model", m])
    check(rc != 0 and ("%s:2: unknown key 'max_draft_tokenz'" % bad) in out,
          "unknown key names file and line:\n" + out)
    rc, out, err = run([v, "--check-config", "--max-draft-tokens", "100", "--model", m])
    check(rc != 0 and "out of range (1 to 64)" in out, "range:\n" + out)
    rc, out, err = run([v, "--check-config", "--model", TMP])
    check(rc != 0 and "does not contain config.json" in out, "model dir check:\n" + out)
    # A verifier without a model would not start: the check says so.
    rc, out, err = run([v, "--check-config"])
    check(rc != 0 and "model='' (default)" in out and "verifier-needs-model" in out,
          "verifier without a model:\n" + out)
    # A model directory is read: fingerprints printed.
    rc, out, err = run([v, "--check-config", "--model", m])
    check(rc == 0 and ("# tokenizer fingerprint: " + reference().tokenizer_fp(
        tokenizer("qwen2_bpe1000"))) in out, "fingerprint printed:\n" + out + err)
    # A corrupt weights file fails the check (the model files are read).
    broken = os.path.join(TMP, "broken")
    os.makedirs(broken, exist_ok=True)
    shutil.copy(os.path.join(m, "config.json"), broken)
    with open(os.path.join(broken, "model.safetensors"), "wb") as fh:
        fh.write(b"\xff" * 16)
    rc, out, err = run([v, "--check-config", "--model", broken])
    check(rc != 0 and "model.safetensors" in out, "corrupt weights:\n" + out)
    # Each binary answers --check-config and --help.
    for b in ("tandem-gateway", "tandem-drafter", "tandem-verifier"):
        rc, out, err = run([binary(b), "--check-config"] +
                           (["--model", m] if b == "tandem-verifier" else []))
        check(rc == 0 and "would start" in out, "%s --check-config: %s" % (b, out + err))
        rc, out, err = run([binary(b), "--help"])
        check(rc == 0 and "--listen" in out and "TANDEM_HEALTH_LISTEN" in out,
              "%s --help" % b)
    rc, out, err = run([binary("tandem-drafter"), "--check-config", "--drafter-kind", "model"])
    check(rc != 0 and "drafter_kind=model (flag:--drafter-kind)" in out and
          "model='' (default)" in out, "drafter kind conflict:\n" + out)
    rc, out, err = run([binary("tandem-gateway"), "--check-config", "--max-draft-tokens", "4"])
    check(rc != 0 and "unknown flag --max-draft-tokens" in out, "gateway has no such flag")


def case_check_config_offline():
    t = binary("tandem")
    tok = "qwen2_bpe1000"
    vm = model("target", "f32_gqa", tok)
    dm = model("draft", "f32_tied", tok)
    dm_other = model("draft-b", "f32_tied", "gpt2_bpe2000")
    v = write("v.yaml", "model: %s\nmax_draft_tokens: 4\n" % vm)
    d_ok = write("d-ok.yaml", "model: %s\ndraft_block_size: 4\n" % dm)
    d_block = write("d-block.yaml", "model: %s\ndraft_block_size: 6\n" % dm)
    d_tok = write("d-tok.yaml", "model: %s\n" % dm_other)
    d_bad = write("d-bad.yaml", "draft_block_size: 4\nstate_strategy: replayy\n")
    rc, out, err = run([t, "check-config", "--verifier", v, "--drafter", d_ok])
    check(rc == 0 and "compatible" in out, "compatible pair: rc %d\n%s%s" % (rc, out, err))
    rc, out, err = run([t, "check-config", "--verifier", v, "--drafter", d_block])
    check(rc != 0 and "rule draft-block-size" in out and "blocks of 6 tokens" in out and
          "at most 4" in out, "block size refused:\n" + out)
    rc, out, err = run([t, "check-config", "--verifier", v, "--drafter", d_tok])
    check(rc != 0 and "rule tokenizer-fingerprint" in out, "tokenizer refused:\n" + out)
    rc, out, err = run([t, "check-config", "--verifier", v, "--drafter", d_bad])
    check(rc != 0 and "not one of auto|extra_buffer|no_buffer|replay" in out and d_bad in out,
          "invalid file reported:\n" + out)
    # The environment of the shell running the check does not leak in.
    rc, out, err = run([t, "check-config", "--verifier", v, "--drafter", d_ok],
                       env={"TANDEM_DRAFT_BLOCK_SIZE": "60"})
    check(rc == 0, "environment not read: " + out)
    # Several drafters: each pair judged.
    rc, out, err = run([t, "check-config", "--verifier", v, "--drafter", d_ok, "--drafter",
                        d_block, "--verbose"])
    check(rc != 0 and out.count(": compatible") == 1 and out.count("REFUSED") == 1 and
          "draft_block_size:" in out, "two drafters:\n" + out)
    rc, out, err = run([t, "check-config", "--verifier", v])
    check(rc == 2, "needs both sides")


def case_interop():
    """Health and GetStatus / Describe from Python grpcio on running services."""
    gw = gateway()
    v = replica("verifier", gw, "--replica-id", "v1")
    d = replica("drafter", gw, "--replica-id", "d1")
    wait_status(gw, lambda s: replica_ids(s) == ["d1", "v1"], "both registered")
    for p, svc in ((gw, "tandem.v1.Gateway"), (v, "tandem.v1.Verifier"),
                   (d, "tandem.v1.Drafter")):
        for port in (p.port, p.health_port):
            for name in ("", svc):
                code, details, resp = unary("127.0.0.1:%d" % port,
                                            "/grpc.health.v1.Health/Check", {"service": name})
                check(code == "OK" and resp["status"] == "SERVING",
                      "%s port %d Check(%r): %s %s %s" % (p.name, port, name, code, details, resp))
            code, _, _ = unary("127.0.0.1:%d" % port, "/grpc.health.v1.Health/Check",
                               {"service": "no.such.Service"})
            check(code == "NOT_FOUND", "unknown service: %s" % code)
        c = client()
        ch = c.channel(p.addr())
        code, _, msgs = c.call_stream(ch, "/grpc.health.v1.Health/Watch", {"service": ""},
                                      timeout=5.0, max_messages=1)
        ch.close()
        check(msgs and msgs[0]["status"] == "SERVING", "Watch sends SERVING first: %s" % msgs)
    s = status(gw)
    check(s["gateway"]["role"] == "ROLE_GATEWAY" and len(s["replicas"]) == 2,
          "GetStatus over grpcio")
    for p, path in ((v, "/tandem.v1.Verifier/Describe"), (d, "/tandem.v1.Drafter/Describe")):
        code, details, resp = unary(p.addr(), path)
        check(code == "OK", "%s: %s %s" % (path, code, details))
        if resp:
            entries = {e["key"]: e for e in resp["config"]["entries"]}
            check(entries["state_strategy"]["source"] == "auto" and
                  "rule state-strategy-for-prefix-cache" in entries["state_strategy"]["reason"],
                  "Describe serves the effective config with reasons")
            check(entries["replica_id"]["value"] == resp["descriptor"]["replica_id"],
                  "descriptor matches config")
            names = [c["name"] for c in resp["counters"]]
            check("uptime_seconds" in names and "heartbeats" in names, "counters %s" % names)
    # Malformed bytes get INVALID_ARGUMENT and the gateway keeps serving.
    import grpc
    ch = grpc.insecure_channel(gw.addr())
    fn = ch.unary_unary("/tandem.v1.Registry/RegisterReplica", request_serializer=lambda b: b,
                        response_deserializer=lambda b: b)
    try:
        fn(b"\xff\xff\xff\xff\x0f", timeout=5)
        check(False, "garbage accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "garbage: %s" % e.code())
    # A descriptor that decodes but does not re-encode (field number 0 spelt
    # as a two-byte varint; tests/fuzz/regress) once aborted the gateway.
    with open(os.path.join(ARGS.source, "tests", "fuzz", "regress", "request",
                           "register-descriptor-field-0.pb"), "rb") as f:
        field0 = f.read()[1:]  # the harness's message-type byte
    try:
        fn(field0, timeout=5)
        check(False, "a descriptor with field number 0 accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "field number 0: %s" % e.code())
    ch.close()
    check(len(status(gw)["replicas"]) == 2, "serving after garbage")


def case_run_script():
    """scripts/run.sh (the README's main command) without its build step."""
    import socket
    base = None
    for _ in range(50):
        cand = 20000 + (os.getpid() * 37 + _ * 101) % 40000
        ok = True
        for off in (0, 1, 10, 11, 20, 21):
            sk = socket.socket()
            try:
                sk.bind(("127.0.0.1", cand + off))
            except OSError:
                ok = False
            finally:
                sk.close()
        if ok:
            base = cand
            break
    build = os.path.dirname(os.path.dirname(os.path.dirname(binary("tandem"))))
    e = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    # Its own session, so that a hung run can be stopped with its children.
    p = subprocess.Popen([os.path.join(ARGS.source, "scripts", "run.sh"), "--no-build",
                          "--build-dir", build, "--port-base", str(base), "--once"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=90)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate()
        rc = "timeout"
    check(rc == 0, "run.sh --once exits 0: rc %s\n%s%s" % (rc, out, err))
    check("pairs formed (1):" in out, "the pair is formed:\n" + out)
    check("127.0.0.1:%d" % base in out and "stopped" not in err, "gateway address shown")


CASES = {
    "run_script": case_run_script,
    "pair_formed": case_pair_formed,
    "refusals": case_refusals,
    "ttl": case_ttl,
    "reregister": case_reregister,
    "heartbeat_cadence": case_heartbeat_cadence,
    "timing_lock": case_timing_lock,
    "sigterm": case_sigterm,
    "check_config": case_check_config,
    "check_config_offline": case_check_config_offline,
    "interop": case_interop,
}


def main():
    global ARGS, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    for b in ("cli", "gateway", "verifier", "drafter"):
        ap.add_argument("--" + b, required=True, help="path of the %s binary" % b)
    ap.add_argument("--source", required=True)
    ARGS = ap.parse_args()
    TMP = tempfile.mkdtemp(prefix="tandem-services-")
    try:
        CASES[ARGS.case]()
    finally:
        for p in PROCS:
            if p.p.poll() is None:
                rc = p.stop(signal.SIGTERM)
                check(rc == 0, "%s exits 0 on SIGTERM (rc %s)" % (p.name, rc))
            elif not p.log.closed:
                p.log.close()
        if FAILURES:
            for p in PROCS:
                print("---- log of %s (%s)\n%s" % (p.name, p.log_path, p.text()[-6000:]))
        remove_workdir()
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
