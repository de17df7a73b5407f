#!/usr/bin/python3
"""The prefix-state cache through the services (gateway, verifiers and a
drafter as real processes on loopback, the bundled demo models, Python
grpcio). Expected outputs come from a second stack whose verifier has
prefix_cache off (an independent path: every prompt prefilled whole);
expected counters from a model of the cache written here from its
specification (blocks of prefix_cache_block tokens, chained, at most all of
the prompt but its last token), not from the C code's output.

  identical  prompts sharing a long prefix, greedy and seeded, plain and with
             a drafter speculating: the tokens of a cache-on verifier, whose
             requests after the first start from cached prefixes, are those
             of the cache-off verifier; hits are reported per request
             (cached_prompt_tokens) as the model predicts.
  counters   hits, misses, prompt tokens saved, blocks stored and held, bytes
             held, in Describe, `tandem status` and the Prometheus metrics.
  eviction   a prefix_cache_memory of a few blocks: blocks are evicted, the
             bytes held stay within it, outputs stay those of the cache-off
             verifier, and a prefix used again after others were stored
             is matched only as far as its blocks survived.
  off        prefix_cache off: nothing is looked up, stored or counted.
  config     --check-config: the new settings with their sources (the
             prefix-fetch ones too), the bytes
             of a block (computed here from config.json), gpu_memory auto on
             the cpu backend less the cache's memory, no_buffer refused.
  routing    two cache-on verifiers: requests sharing a prefix go to the one
             that served it last while its load allows, an unrelated prompt
             to the least loaded; with the holder full, a request sharing its
             prefix goes to the other, named the holder as its prefix source,
             which fetches it or prefills it as the cost rule (computed here
             from the rates it reports) says.
  fetch      a verifier's Run with a prefix_source (a cache-on holder that ran
             the prompt first): a fresh verifier fetches the prefix (counters:
             one fetch, its blocks and bytes), starts from it, and its tokens
             are a cache-off verifier's, greedy and seeded; a dead source, and
             a source that lies (chunks replayed from the holder with other
             tokens, a flipped byte, a wrong SHA-256, the last chunk
             missing), fail the fetch and the request prefills instead with
             the same tokens; prefix_fetch_bandwidth of 1 KiB/s makes the
             cost rule prefill without fetching.

usage: prefix_test.py CASE --cli PATH --gateway PATH --verifier PATH
                       --drafter PATH --source ROOT
"""
import argparse
import http.client
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "services"))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import services_test as st  # noqa: E402
import e2e_test as e2e  # noqa: E402

check = st.check
BLOCK = 16
DESCRIBE = "/tandem.v1.Verifier/Describe"


# ---- the stacks ---------------------------------------------------------------------

def stack(cache, *vargs, drafter=True, gwargs=(), drafter_model=None):
    """A gateway, a verifier (prefix_cache on or off, block BLOCK) and a model
    drafter (the demo drafter, or drafter_model)."""
    gw = st.gateway("--tokenizer", e2e.TOKENIZER, *gwargs)
    v = st.replica("verifier", gw, "--model", e2e.TARGET, "--state-strategy", "extra_buffer",
                   "--max-draft-tokens", "8", "--prefix-cache", "on" if cache else "off",
                   "--prefix-cache-block", str(BLOCK), *vargs)
    d = None
    if drafter:
        d = st.replica("drafter", gw, "--model", drafter_model or e2e.DRAFTER,
                       "--state-strategy", "extra_buffer",
                       "--draft-block-size", "4")
        st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 1, "verifier/drafter pair")
    else:
        st.wait_status(gw, lambda s: len(s.get("replicas", [])) >= 1, "verifier registered")
    return gw, v, d


def tokenize(gw, text):
    code, details, resp = st.unary(gw.addr(), "/tandem.v1.Gateway/Tokenize", {"text": text})
    check(code == "OK", "Tokenize: %s %s" % (code, details))
    return [int(x) for x in resp["ids"]]


def prompts(gw):
    """Prompts sharing a long prefix (about 10 blocks) with suffixes of
    different lengths, two that share a shorter one, and one unrelated."""
    text = e2e.prompts(12)
    shared = tokenize(gw, "".join(text[0:3]))[:165]
    out = [shared + tokenize(gw, text[3 + i])[:5 + 9 * i] for i in range(4)]
    out.append(shared[:40] + tokenize(gw, text[8])[:30])
    out.append(shared[:40] + tokenize(gw, text[9])[:3])
    out.append(tokenize(gw, text[10])[:70])
    out.append(shared[:BLOCK + 1])  # exactly one block and the last token
    return out


def generate(gw, ids, spec, sampling=None, max_tokens=20):
    req = {"token_ids": {"ids": ids}, "max_tokens": max_tokens, "ignore_eos": True,
           "speculation": {"mode": "SPECULATION_MODE_ON" if spec else "SPECULATION_MODE_OFF"}}
    if sampling:
        req["sampling"] = sampling
    code, details, out, _, done = st.generate(gw, req)
    check(code == "OK", "Generate: %s %s" % (code, details))
    return out, (done or {}).get("stats", {})


class Model:
    """The cache as specified: blocks of BLOCK tokens, chained; a lookup
    matches whole blocks, at most all of the prompt but its last token; a
    request stores every block boundary its state passes: the prompt's and
    those of its generated text, up to the last generated token (which is
    never run through the model)."""

    def __init__(self):
        self.blocks = set()
        self.hits = self.misses = self.saved = 0

    def run(self, ids, out=()):
        most = (len(ids) - 1) // BLOCK
        k = 0
        while k < most and tuple(ids[:(k + 1) * BLOCK]) in self.blocks:
            k += 1
        if most > 0:
            if k > 0:
                self.hits += 1
                self.saved += k * BLOCK
            else:
                self.misses += 1
        seen = list(ids) + list(out)
        for j in range(1, (len(seen) - 1) // BLOCK + 1):
            self.blocks.add(tuple(seen[:j * BLOCK]))
        return k * BLOCK


def counters(v):
    return st.counters(v.addr(), DESCRIBE)


def stop_all():
    """SIGTERM to every process, each of which must exit 0 (a sanitizer build
    fails the exit on a leak)."""
    for p in reversed(st.PROCS):
        if p.p.poll() is None:
            rc = p.stop()
            check(rc == 0, "%s exits 0 on SIGTERM (rc %s)" % (p.name, rc))
    st.PROCS.clear()


SAMPLINGS = [None, {"temperature": 0.8, "top_p": 0.95, "seed": 1234}]


def run_all(gw, ps, spec, sampling):
    return [generate(gw, p, spec, sampling) for p in ps]


def cache_off_tokens(gw_off, ps):
    """Every prompt's tokens from a verifier without the cache, by (sampling,
    speculation)."""
    want = {}
    for si, smp in enumerate(SAMPLINGS):
        for spec in (False, True):
            want[si, spec] = [ids for ids, _ in run_all(gw_off, ps, spec, smp)]
    return want


def check_cached_runs(gw, ps, want, model, what):
    """Every prompt through gw under each sampling, plain and speculative: the
    cache-off tokens (want), with the prompt tokens the cache model says."""
    for si, smp in enumerate(SAMPLINGS):
        for spec in (False, True):
            for i, (ids, stats) in enumerate(run_all(gw, ps, spec, smp)):
                expect = model.run(ps[i], ids)
                cached = int(stats.get("cached_prompt_tokens", 0))
                check(cached == expect,
                      "%ssampling %d spec %s prompt %d (%d tokens): %d prompt tokens from the "
                      "cache, the model says %d" % (what, si, spec, i, len(ps[i]), cached, expect))
                check(ids == want[si, spec][i],
                      "%ssampling %d spec %s prompt %d (%d cached): tokens %s, cache off %s" %
                      (what, si, spec, i, cached, ids, want[si, spec][i]))
                if spec:
                    check("on" in stats.get("speculation", ""),
                          "%sa drafter speculated: %s" % (what, stats.get("speculation")))


# ---- cases --------------------------------------------------------------------------

def case_identical():
    gw_off, v_off, _ = stack(False)
    ps = prompts(gw_off)
    want = cache_off_tokens(gw_off, ps)
    c = counters(v_off)
    check(c.get("prefix_cache_hits", -1) == 0 and c.get("prefix_cache_blocks", -1) == 0,
          "the cache-off verifier counts no hit and holds no block: %s" % c)

    gw, v, _ = stack(True)
    model = Model()
    check_cached_runs(gw, ps, want, model, "")
    check(model.hits > 0, "the workload hits the cache")
    # A conversation's next turn: the prompt holds the last answer; the
    # cache covers it too (its blocks were stored as it was generated).
    for spec in (False, True):
        first = ps[2] + want[0, spec][2] + ps[6][:7]
        turn = first + want[0, spec][2][:5] + ps[6][20:31]
        for p in (first, turn):
            w, _ = generate(gw_off, p, spec)
            ids, stats = generate(gw, p, spec)
            expect = model.run(p, ids)
            cached = int(stats.get("cached_prompt_tokens", 0))
            check(cached == expect and cached > len(ps[2]),
                  "next turn (spec %s, %d tokens): %d cached, the model says %d" %
                  (spec, len(p), cached, expect))
            check(ids == w, "next turn (spec %s): %s, cache off %s" % (spec, ids, w))
    # Concurrent requests: prefills of one prefix at once, each stores or finds.
    out = e2e.parallel(lambda p: generate(gw, p, True), ps + ps, workers=8)
    for i, (ids, _) in enumerate(out):
        check(ids == want[0, True][i % len(ps)], "concurrent prompt %d: %s vs %s" %
              (i, ids, want[0, True][i % len(ps)]))
    stop_all()
    final_round()


def final_round():
    """A request's final round verifies only the drafts it can still emit,
    so its last token is never run through the model and the blocks it
    stores end before it, speculative or not. A drafter on the target's own
    weights has every draft accepted; in fixed blocks of 4 most lengths end
    inside a block, whose drafts past the last token were verified (and the
    state past it stored) before."""
    gw, v, _ = stack(True, drafter_model=e2e.TARGET)
    ps = prompts(gw)
    shared = ps[0][:165] + ps[6]
    check(len(shared) >= 12 * BLOCK, "a prompt of %d tokens to cut from" % len(shared))
    model = Model()
    spec = {"mode": "SPECULATION_MODE_ON", "block_size": 4, "fixed_block_size": True}
    for m in range(2, 10):
        # The prompt and its m tokens end a block; its first token its own,
        # so that no other length's blocks match it.
        p = [100 + m] + shared[1:12 * BLOCK - m]
        req = {"token_ids": {"ids": p}, "max_tokens": m, "ignore_eos": True,
               "speculation": spec}
        code, details, ids, _, done = st.generate(gw, req)
        check(code == "OK", "Generate: %s %s" % (code, details))
        stats = (done or {}).get("stats", {})
        check(int(stats.get("accepted_tokens", 0)) > 0 or m < 3,
              "%d tokens: drafts on the target's weights accepted: %s" % (m, stats))
        model.run(p, ids)
        turn = p + ids + ps[5][-3:]
        out, got = generate(gw, turn, False)
        expect = model.run(turn, out)
        check(int(got.get("cached_prompt_tokens", 0)) == expect == 11 * BLOCK,
              "%d tokens speculated in blocks of 4: the next turn found %s cached, the model "
              "says %d (the block the last token ends is not stored)" %
              (m, got.get("cached_prompt_tokens"), expect))
    stop_all()


def metrics_port(p):
    m = re.search(r"metrics port (\d+)", p.text())
    check(m, "%s logged its metrics port" % p.name)
    return int(m.group(1)) if m else 0


def scrape(p):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port(p), timeout=10) as r:
        text = r.read().decode("utf-8")
    out = {}
    for line in text.splitlines():
        if line.startswith("tandem_prefix_cache"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def case_counters():
    gw, v, _ = stack(True, drafter=False,
                     gwargs=("--http-listen", "127.0.0.1:0", "--http-model-name", "demo"))
    ps = prompts(gw)
    model = Model()
    for p in ps + ps[:3]:
        out, _ = generate(gw, p, False)
        model.run(p, out)
    c = counters(v)
    stored = len(model.blocks)
    want = {"prefix_cache_hits": model.hits, "prefix_cache_misses": model.misses,
            "prefix_cache_tokens_saved": model.saved, "prefix_cache_blocks_stored": stored,
            "prefix_cache_blocks": stored, "prefix_cache_evictions": 0}
    for k, val in want.items():
        check(c.get(k) == val, "Describe %s: %s, the model says %s" % (k, c.get(k), val))
    check(c.get("prefix_cache_bytes", 0) > stored * BLOCK * 4,
          "bytes held (%s) cover %d blocks' states" % (c.get("prefix_cache_bytes"), stored))
    check(c.get("prefix_cache_memory_bytes") == 4 << 30, "the budget: %s" %
          c.get("prefix_cache_memory_bytes"))
    # Prometheus, the same numbers.
    m = scrape(v)
    for name, key in (('tandem_prefix_cache_requests_total{outcome="hit"}', "prefix_cache_hits"),
                      ('tandem_prefix_cache_requests_total{outcome="miss"}',
                       "prefix_cache_misses"),
                      ("tandem_prefix_cache_tokens_saved_total", "prefix_cache_tokens_saved"),
                      ("tandem_prefix_cache_blocks", "prefix_cache_blocks"),
                      ("tandem_prefix_cache_memory_bytes", "prefix_cache_bytes")):
        check(m.get(name) == c.get(key), "metric %s = %s, Describe %s = %s" %
              (name, m.get(name), key, c.get(key)))
    # tandem status, after the next heartbeat carries them.
    st.wait_status(gw, lambda s: any(
        cc["name"] == "prefix_cache_hits" and float(cc["value"]) == model.hits
        for r in s.get("replicas", []) for cc in (r.get("load") or {}).get("counters", [])),
        "the heartbeat carries the prefix cache counters")
    rc, out, err = st.run([st.ARGS.cli, "status", "--gateway", gw.addr()])
    line = re.search(r"prefix cache \(block (\d+)\): (\d+) hits, (\d+) misses .*?(\d+) prompt "
                     r"tokens saved; (\d+) blocks", out)
    check(rc == 0 and line and [int(x) for x in line.groups()] ==
          [BLOCK, model.hits, model.misses, model.saved, stored],
          "tandem status shows the prefix cache:\n" + out + err)
    # The OpenAI-compatible API reports the hit as OpenAI does.
    port = re.search(r"OpenAI-compatible API on \S+ \(port (\d+),", gw.text())
    if check(port, "the gateway logged its HTTP port"):
        c = http.client.HTTPConnection("127.0.0.1", int(port.group(1)), timeout=60)
        body = {"model": "demo", "prompt": ps[1], "max_tokens": 4, "temperature": 0}
        c.request("POST", "/v1/completions", json.dumps(body).encode(),
                  {"Content-Type": "application/json"})
        r = json.loads(c.getresponse().read().decode())
        c.close()
        want_cached = model.run(ps[1])
        got = ((r.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        check(got == want_cached and want_cached > 0,
              "usage.prompt_tokens_details.cached_tokens %s, the model says %d: %s" %
              (got, want_cached, r.get("usage")))
    stop_all()


def case_eviction():
    gw_off, v_off, _ = stack(False, drafter=False)
    ps = prompts(gw_off)
    want = [ids for ids, _ in run_all(gw_off, ps, False, None)]
    # The bytes of one block, from a cache-on verifier that stored one.
    gw1, v1, _ = stack(True, drafter=False)
    generate(gw1, ps[-1], False)
    c1 = counters(v1)
    one = c1.get("prefix_cache_bytes", 0) / max(1, c1.get("prefix_cache_blocks", 0))
    check(one > 0, "one block holds bytes (%s)" % c1)
    budget = int(one * 3.5)
    gw, v, _ = stack(True, "--prefix-cache-memory", str(budget), drafter=False)
    for rounds in range(2):
        got = run_all(gw, ps, False, None)
        for i, (ids, stats) in enumerate(got):
            check(ids == want[i], "round %d prompt %d (%s cached): %s vs %s" %
                  (rounds, i, stats.get("cached_prompt_tokens"), ids, want[i]))
        c = counters(v)
        check(c.get("prefix_cache_bytes", budget + 1) <= budget,
              "bytes held %s within the budget %d" % (c.get("prefix_cache_bytes"), budget))
        check(c.get("prefix_cache_blocks", 99) <= 3, "at most 3 blocks held: %s" % c)
    check(c.get("prefix_cache_evictions", 0) > 0, "blocks were evicted: %s" % c)
    # The last prompt stored stays matched: its blocks are the newest.
    last = ps[3]
    _, stats = generate(gw, last, False)
    check(int(stats.get("cached_prompt_tokens", 0)) > 0,
          "the newest prefix still hits after evictions: %s" % stats)
    stop_all()


def case_off():
    gw, v, _ = stack(False, drafter=False)
    ps = prompts(gw)
    for p in ps + ps:
        _, stats = generate(gw, p, False)
        check(int(stats.get("cached_prompt_tokens", 0)) == 0, "off: nothing restored: %s" % stats)
    c = counters(v)
    for k in ("prefix_cache_hits", "prefix_cache_misses", "prefix_cache_tokens_saved",
              "prefix_cache_blocks_stored", "prefix_cache_blocks", "prefix_cache_bytes",
              "prefix_cache_memory_bytes"):
        check(c.get(k) == 0, "off: %s is %s" % (k, c.get(k)))
    st.wait_status(gw, lambda s: len(s.get("replicas", [])) >= 1, "registered")
    rc, out, _ = st.run([st.ARGS.cli, "status", "--gateway", gw.addr()])
    check("prefix cache (block" not in out and "prefix_cache off" in out,
          "status shows no prefix cache line when it is off:\n" + out)
    stop_all()


class Running:
    """A long generation read on a thread of its own, cancelled when done
    with (it holds its verifier's place meanwhile)."""

    def __init__(self, gw, ids, max_tokens=3500):
        from google.protobuf import json_format
        import grpc
        req_cls, resp_cls, _ = st.client()._method("/tandem.v1.Gateway/Generate")
        req = {"token_ids": {"ids": ids}, "max_tokens": max_tokens, "ignore_eos": True,
               "speculation": {"mode": "SPECULATION_MODE_OFF"}}
        self.ch = grpc.insecure_channel(gw.addr())
        fn = self.ch.unary_stream("/tandem.v1.Gateway/Generate",
                                  request_serializer=req_cls.SerializeToString,
                                  response_deserializer=resp_cls.FromString)
        self.it = fn(json_format.ParseDict(req, req_cls()), timeout=600)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        try:
            for _ in self.it:
                pass
        except Exception:  # cancelled
            pass

    def cancel(self):
        self.it.cancel()
        self.t.join(60)
        self.ch.close()


def active(v):
    return counters(v).get("active_sequences", 0)


def wait_active(v, n, timeout=30.0):
    """Until v runs n sequences (n > 0: at least; 0: none)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        a = active(v)
        if (a >= n) if n > 0 else (a == 0):
            return True
        time.sleep(0.02)
    return check(False, "%s never reached %d active sequences" % (v.name, n))


def wait_load(gw, rid, n):
    """Until the gateway's view of replica rid has n active sequences (its
    last heartbeat's, and the requests it has in flight there), from a
    heartbeat recent enough that the replica stays fresh (2 intervals +
    250 ms) for a while yet."""
    def seen(s):
        for r in s.get("replicas", []):
            if r["descriptor"]["replica_id"] == rid:
                return (int((r.get("load") or {}).get("active_sequences", -1)) == n and
                        int(r.get("requests_in_flight", 0)) <= n and
                        float(r.get("heartbeat_age_ms", 1e9)) < 800)
        return False
    st.wait_status(gw, seen, "%s reports %d active sequences" % (rid, n))


def routing_view(gw):
    """The gateway's view of its replicas and its prefix affinity log, for a
    failed routing check."""
    s = st.status(gw)
    view = [(r["descriptor"]["replica_id"], r.get("heartbeat_age_ms"),
             (r.get("load") or {}).get("active_sequences"), r.get("requests_in_flight", 0))
            for r in s.get("replicas", [])]
    log = [ln for ln in gw.text().splitlines() if "prefix affinity" in ln]
    return "gateway view (id, heartbeat age ms, active, in flight): %s; log: %s" % (view, log[-4:])


def case_routing():
    gw = st.gateway("--tokenizer", e2e.TOKENIZER, "--log-level", "debug")
    vs = [st.replica("verifier", gw, "--model", e2e.TARGET, "--prefix-cache", "on",
                     "--prefix-cache-block", str(BLOCK), "--max-sequences", "2",
                     "--replica-id", "v%d" % i) for i in range(2)]
    st.wait_status(gw, lambda s: len(s.get("replicas", [])) == 2, "two verifiers")
    by_id = {"v0": vs[0], "v1": vs[1]}
    ps = prompts(gw)
    shared, other = ps[0], ps[6]
    sibling = ps[1]  # the same first 165 tokens, another suffix
    # A blocker on whichever verifier comes first, then the shared prompt
    # goes to the other (least loaded).
    b0 = Running(gw, other)
    deadline = time.time() + 30
    while time.time() < deadline and active(vs[0]) + active(vs[1]) < 1:
        time.sleep(0.02)
    check(active(vs[0]) + active(vs[1]) == 1, "the blocker runs")
    _, s1 = generate(gw, shared, False)
    holder = s1.get("verifier")
    busy = [k for k, v in by_id.items() if active(v) > 0]
    check(holder in by_id and busy and holder != busy[0],
          "the first shared prompt goes to the idle verifier: %s (busy %s)" % (holder, busy))
    b0.cancel()
    wait_active(vs[0], 0)
    wait_active(vs[1], 0)
    # ... and the gateway has heard so (its view of load is the last heartbeat).
    wait_load(gw, "v0", 0)
    wait_load(gw, "v1", 0)
    # With both idle, the sibling goes to the holder and starts from its
    # cache; a request sharing nothing goes to the least loaded.
    _, s2 = generate(gw, sibling, False)
    check(s2.get("verifier") == holder and int(s2.get("cached_prompt_tokens", 0)) >= 160,
          "the sibling goes to the holder %s and hits: %s; %s" % (holder, s2, routing_view(gw)))
    # The holder one request busier than the other: still the holder
    # (prefix_affinity_slack 4), and a hit.
    b1 = Running(gw, shared[:40] + other[:30])
    wait_active(by_id[holder], 1)
    if check(active(by_id[holder]) == 1, "the second blocker shares the prefix: on the holder"):
        inflight = {r["descriptor"]["replica_id"]: int(r.get("requests_in_flight", 0))
                    for r in st.status(gw).get("replicas", [])}
        check(inflight == {holder: 1, [k for k in by_id if k != holder][0]: 0},
              "the gateway's status counts the request in flight on the holder: %s" % inflight)
        _, s3 = generate(gw, ps[2], False)
        check(s3.get("verifier") == holder and int(s3.get("cached_prompt_tokens", 0)) >= 160,
              "one request busier, the holder still takes the prefix: %s; %s" % (s3, routing_view(gw)))
        # An unrelated prompt goes to the least loaded.
        _, s4 = generate(gw, ps[7][:3] + other[5:60], False)
        check(s4.get("verifier") != holder, "an unrelated prompt goes to the idle one: %s" % s4)
        # The holder full (max_sequences 2): the prefix goes to the other.
        # (First the gateway hears that the holder runs only b1 now: a
        # heartbeat from while s3 ran would count it full already.)
        wait_load(gw, holder, 1)
        b2 = Running(gw, shared[:40] + other[:20])
        wait_active(by_id[holder], 2)
        peer = [v for k, v in by_id.items() if k != holder][0]
        c0 = counters(peer)
        want = min((len(ps[3]) - 1) // BLOCK, 10) * BLOCK
        fetch = expect_fetch(c0, want, 0, block_bytes(e2e.TARGET, BLOCK), 5.0)
        _, s5 = generate(gw, ps[3], False)
        check(s5.get("verifier") != holder,
              "with the holder full, the prefix goes to the other: %s; %s" % (s5, routing_view(gw)))
        check(re.search(r"prefix affinity: %s holds \d+ of the prompt's tokens but is passed "
                        r"for v\d: it is full \(last heartbeat \d+ ms ago, load 2 of "
                        r"max_sequences 2" % holder, gw.text()),
              "the gateway's debug log says why it passed the holder: %s" % routing_view(gw))
        c1 = counters(peer)
        d = {k: c1.get(k, 0) - c0.get(k, 0) for k in ("prefix_fetches", "prefix_fetch_failures",
                                                      "prefix_fetch_recomputed")}
        check(d == {"prefix_fetches": 1 if fetch else 0, "prefix_fetch_failures": 0,
                    "prefix_fetch_recomputed": 0 if fetch else 1},
              "the other verifier, named the holder as the source, %s: %s (rates %s)" % (
                  "fetches" if fetch else "prefills", d,
                  {k: c0.get(k) for k in ("prefix_fetch_bandwidth_bytes_per_ms",
                                          "prefill_tokens_per_ms")}))
        if fetch:
            check(int(s5.get("cached_prompt_tokens", 0)) == want,
                  "and starts from the fetched prefix: %s" % s5)
        b2.cancel()
    b1.cancel()
    code, details, resp = st.unary(gw.addr(), "/tandem.v1.Gateway/GetStatus")
    gc = {c["name"]: float(c["value"]) for c in (resp or {}).get("counters", [])}
    check(gc.get("prefix_affinity_picks", 0) >= 2 and gc.get("prefix_affinity_passed", 0) >= 1,
          "gateway counters: %s" % {k: v for k, v in gc.items() if "affinity" in k})
    stop_all()


# ---- fetching a prefix from a peer ------------------------------------------------

PREFILL_PRIOR = 4.0  # tokens per ms until a verifier measured its own (README)


def run_direct(v, ids, sampling=None, source=None, max_tokens=12):
    """The verifier's own Run (as a gateway calls it): tokens and stats."""
    req = {"request_id": "r%d" % int(time.time() * 1e6), "prompt_ids": ids,
           "max_tokens": max_tokens}
    if sampling:
        req["sampling"] = sampling
    if source:
        req["prefix_source"] = source
    c = st.client()
    ch = c.channel(v.addr())
    try:
        code, details, msgs = c.call_stream(ch, "/tandem.v1.Verifier/Run", req, 120.0)
    finally:
        ch.close()
    check(code == "OK", "Run on %s: %s %s" % (v.name, code, details))
    out, stats = [], {}
    for m in msgs:
        if "tokens" in m:
            out += [int(x) for x in m["tokens"].get("ids", [])]
        if "complete" in m:
            stats = m["complete"].get("stats", {})
    return out, stats


def expect_fetch(c, want, have, bbytes, latency_ms):
    """The cost rule as the README states it, from the rates a verifier
    reports: fetch when latency + bytes / bandwidth < missing / prefill rate."""
    fetch_ms = latency_ms + (want // BLOCK) * bbytes / c["prefix_fetch_bandwidth_bytes_per_ms"]
    prefill_ms = (want - have) / c["prefill_tokens_per_ms"]
    return fetch_ms < prefill_ms


class FakeSource:
    """A FetchPrefix server that replays `chunks` (messages), for a source
    that lies."""

    def __init__(self, chunks):
        import grpc
        from concurrent import futures
        req_cls, resp_cls, _ = st.client()._method("/tandem.v1.Verifier/FetchPrefix")

        def fetch(req, ctx):
            for m in chunks:
                yield m
        h = grpc.method_handlers_generic_handler("tandem.v1.Verifier", {
            "FetchPrefix": grpc.unary_stream_rpc_method_handler(
                fetch, request_deserializer=req_cls.FromString,
                response_serializer=resp_cls.SerializeToString)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((h,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def addr(self):
        return "127.0.0.1:%d" % self.port

    def stop(self):
        self.server.stop(0)


def fetch_chunks(v, ids):
    """The holder's FetchPrefix answer for ids, as messages."""
    import grpc
    from google.protobuf import json_format
    req_cls, resp_cls, _ = st.client()._method("/tandem.v1.Verifier/FetchPrefix")
    ch = grpc.insecure_channel(v.addr())
    fn = ch.unary_stream("/tandem.v1.Verifier/FetchPrefix",
                         request_serializer=req_cls.SerializeToString,
                         response_deserializer=resp_cls.FromString)
    req = json_format.ParseDict({"tokens": ids, "block": BLOCK, "chunk_bytes": 65536}, req_cls())
    out = list(fn(req, timeout=30))
    ch.close()
    return out, resp_cls


def case_fetch():
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    common = ("--model", e2e.TARGET, "--state-strategy", "extra_buffer", "--prefix-cache-block",
              str(BLOCK))
    holder = st.replica("verifier", gw, *common, "--prefix-cache", "on", "--replica-id", "vh")
    ref = st.replica("verifier", gw, *common, "--prefix-cache", "off", "--replica-id", "vr")
    ps = prompts(gw)
    shared, sibling = ps[0], ps[1]
    want = (len(sibling) - 1) // BLOCK * BLOCK
    want = min(want, 160)  # the holder's cache covers the 165 shared tokens' 10 blocks
    bbytes = block_bytes(e2e.TARGET, BLOCK)
    run_direct(holder, shared)
    check(counters(holder).get("prefix_cache_blocks", 0) >= want // BLOCK,
          "the holder cached the shared prefix: %s" % counters(holder))
    source = {"replica_id": "vh", "address": holder.addr(), "tokens": want}
    n = [0]

    def fresh(*extra):
        n[0] += 1
        return st.replica("verifier", gw, *common, "--prefix-cache", "on",
                          "--replica-id", "vf%d" % n[0], *extra)

    # Fetched: the counters, the hit, the tokens.
    for sampling in SAMPLINGS:
        f = fresh()
        c0 = counters(f)
        check(expect_fetch(c0, want, 0, bbytes, 5.0),
              "the rule favours fetching on a fresh verifier: %s" % c0)
        got, stats = run_direct(f, sibling, sampling, source)
        exp, _ = run_direct(ref, sibling, sampling)
        c = counters(f)
        check(c.get("prefix_fetches") == 1 and c.get("prefix_fetch_failures") == 0 and
              c.get("prefix_fetch_blocks") == want // BLOCK and
              c.get("prefix_fetch_bytes") == want // BLOCK * bbytes and
              c.get("prefix_fetch_ms", 0) > 0 and c.get("prefix_fetch_recomputed") == 0,
              "one fetch of %d blocks of %d bytes: %s" % (
                  want // BLOCK, bbytes, {k: v for k, v in c.items() if "fetch" in k}))
        check(int(stats.get("cached_prompt_tokens", 0)) == want and
              c.get("prefix_cache_hits") == 1,
              "the request starts from the fetched prefix: %s" % stats)
        check(got == exp and len(got) == 12,
              "fetched prefix, %s: tokens are the cache-off verifier's\n%s\n%s" % (
                  sampling, got, exp))
        check(c.get("prefix_fetch_bandwidth_bytes_per_ms", 0) > 0 and
              c.get("prefill_tokens_per_ms", 0) > 0, "the measured rates are reported")
        f.stop()
        st.PROCS.remove(f)

    # Dead and lying sources: the fetch fails, the request prefills.
    chunks, resp_cls = fetch_chunks(holder, sibling[:want])
    check(len(chunks) >= 3 and chunks[0].layout.prefix_block == BLOCK,
          "the holder's answer: %d chunks" % len(chunks))

    def altered(fn):
        out = []
        for m in chunks:
            x = resp_cls()
            x.CopyFrom(m)
            out.append(x)
        fn(out)
        return out

    def other_tokens(cs):
        cs[0].layout.tokens[3] = (cs[0].layout.tokens[3] + 1) % 1000

    def flip(cs):
        b = bytearray(cs[1].data)
        b[len(b) // 2] ^= 0x10
        cs[1].data = bytes(b)

    def bad_sha(cs):
        cs[0].layout.sha256 = bytes(32)

    liars = {"other tokens": altered(other_tokens), "a flipped byte": altered(flip),
             "a wrong SHA-256": altered(bad_sha), "no last chunk": altered(lambda cs: cs.pop())}
    sources = [("dead", "127.0.0.1:1", None)]
    for what, cs in liars.items():
        fk = FakeSource(cs)
        sources.append((what, fk.addr(), fk))
    exp, _ = run_direct(ref, sibling, SAMPLINGS[1])
    for what, addr, fk in sources:
        f = fresh()
        got, stats = run_direct(f, sibling, SAMPLINGS[1],
                                {"replica_id": "liar", "address": addr, "tokens": want})
        c = counters(f)
        check(c.get("prefix_fetches") == 1 and c.get("prefix_fetch_failures") == 1 and
              c.get("prefix_fetch_blocks") == 0 and c.get("prefix_cache_hits") == 0,
              "%s source: the fetch fails: %s" % (what, {k: v for k, v in c.items()
                                                         if "fetch" in k or "hits" in k}))
        check(got == exp and int(stats.get("cached_prompt_tokens", 0)) == 0,
              "%s source: the request prefills and its tokens are the same" % what)
        f.stop()
        st.PROCS.remove(f)
        if fk:
            fk.stop()

    # Told fetching is slow (no measurement yet): prefill, no fetch.
    f = fresh("--prefix-fetch-bandwidth", "1KiB")
    c0 = counters(f)
    check(c0.get("prefix_fetch_bandwidth_bytes_per_ms") == 1.024 and
          not expect_fetch(c0, want, 0, bbytes, 5.0),
          "1 KiB/s: the rule favours prefilling: %s" % c0)
    got, stats = run_direct(f, sibling, SAMPLINGS[1], source)
    c = counters(f)
    check(c.get("prefix_fetches") == 0 and c.get("prefix_fetch_recomputed") == 1 and
          int(stats.get("cached_prompt_tokens", 0)) == 0 and got == exp,
          "slow fetching: the request prefills: %s" % {k: v for k, v in c.items() if "fetch" in k})
    stop_all()


def case_tensor_parallel():
    """A verifier split over 2 and 4 ranks keeps its prefix cache in the
    whole model's layout: its requests give the cache-off single verifier's
    tokens with the cache model's hits (blocks stored from prompts, from
    generated text and from inside verified draft blocks, under replay and
    extra_buffer), and prefixes move by FetchPrefix between a whole verifier
    and a split one, both ways."""
    gw_off, v_off, _ = stack(False)
    ps = prompts(gw_off)
    want = cache_off_tokens(gw_off, ps)
    stop_all()
    for tp, strategy in ((2, "replay"), (4, "extra_buffer")):
        gw, v, _ = stack(True, "--tensor-parallel", str(tp), "--state-strategy", strategy)
        model = Model()
        check_cached_runs(gw, ps, want, model, "tp %d %s " % (tp, strategy))
        c = counters(v)
        check(model.hits > 0 and c.get("prefix_cache_hits", 0) == model.hits,
              "tp %d: %d hits, the model says %d" % (tp, c.get("prefix_cache_hits", 0),
                                                     model.hits))
        print("tensor_parallel %d, %s: %d requests as one verifier, %d hits" %
              (tp, strategy, 4 * len(ps), model.hits), flush=True)
        stop_all()

    # FetchPrefix between a whole verifier and a split one, both ways: the
    # fetched blocks are in the whole model's layout.
    gw = st.gateway("--tokenizer", e2e.TOKENIZER)
    common = ("--model", e2e.TARGET, "--state-strategy", "extra_buffer", "--prefix-cache-block",
              str(BLOCK), "--prefix-cache", "on")
    shared, sibling = ps[0], ps[1]
    n = min((len(sibling) - 1) // BLOCK * BLOCK, 160)
    ref = st.replica("verifier", gw, *common[:-2], "--prefix-cache", "off", "--replica-id", "vr")
    for holder_tp, taker_tp in ((1, 2), (2, 1), (2, 4)):
        holder = st.replica("verifier", gw, *common, "--tensor-parallel", str(holder_tp),
                            "--replica-id", "vh%d%d" % (holder_tp, taker_tp))
        taker = st.replica("verifier", gw, *common, "--tensor-parallel", str(taker_tp),
                           "--replica-id", "vt%d%d" % (holder_tp, taker_tp))
        run_direct(holder, shared)
        source = {"replica_id": "vh%d%d" % (holder_tp, taker_tp), "address": holder.addr(),
                  "tokens": n}
        for k, sampling in enumerate(SAMPLINGS):
            got, stats = run_direct(taker, sibling, sampling, source)
            exp, _ = run_direct(ref, sibling, sampling)
            # the first request fetches; the next also finds what the first stored
            cached = int(stats.get("cached_prompt_tokens", 0))
            check(cached == n if k == 0 else cached >= n,
                  "tp %d -> tp %d, request %d: the request starts from the fetched %d tokens: "
                  "%s" % (holder_tp, taker_tp, k, n, stats))
            check(got == exp, "tp %d -> tp %d, %s: %s, one verifier without the cache %s" %
                  (holder_tp, taker_tp, sampling, got, exp))
        c = counters(taker)
        check(c.get("prefix_fetches") == 1 and c.get("prefix_fetch_failures") == 0,
              "tp %d -> tp %d: one fetch: %s" % (holder_tp, taker_tp,
                                                 {k: v for k, v in c.items() if "fetch" in k}))
        print("prefix fetched from tensor_parallel %d into %d" % (holder_tp, taker_tp),
              flush=True)
        for p in (taker, holder):
            p.stop()
            st.PROCS.remove(p)
    stop_all()


def block_bytes(model_dir, block):
    """One cache block's bytes from config.json, as the README describes it:
    per linear layer its conv window (K-1) x conv_dim and recurrent state
    Hv x Dk x Dv, per attention layer K and V of `block` positions, fp32."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    floats = 0
    for t in c["layer_types"]:
        if t == "linear_attention":
            floats += (c["linear_conv_kernel_dim"] - 1) * conv_dim + hv * dk * dv
        else:
            floats += 2 * block * c["num_key_value_heads"] * c["head_dim"]
    return 4 * floats


def case_config():
    v = st.ARGS.verifier
    rc, out, err = st.run([v, "--model", e2e.TARGET, "--check-config", "--prefix-cache", "on",
                           "--prefix-cache-block", "32", "--prefix-cache-memory", "1GiB",
                           "--backend", "cpu"])
    check(rc == 0, "check-config with the prefix cache: rc %d\n%s%s" % (rc, out, err))
    check(re.search(r"prefix_cache_block:\s+32\s+# flag:--prefix-cache-block", out) and
          re.search(r"prefix_cache_memory:\s+1GiB\s+# flag:--prefix-cache-memory", out),
          "both keys with their sources:\n" + out)
    check(re.search(r"prefix_fetch_bandwidth:\s+100MiB\s+# default", out) and
          re.search(r"prefix_fetch_latency:\s+5ms\s+# default", out) and
          re.search(r"prefix_fetch_timeout:\s+2s\s+# default", out),
          "the prefix-fetch settings with their defaults:\n" + out)
    rc2, out2, err2 = st.run([v, "--model", e2e.TARGET, "--check-config", "--prefix-cache", "on",
                              "--prefix-fetch-bandwidth", "1KiB", "--backend", "cpu"])
    flag = r"prefix_fetch_bandwidth:\s+1KiB\s+# flag:--prefix-fetch-bandwidth"
    check(rc2 == 0 and re.search(flag, out2),
          "prefix_fetch_bandwidth from a flag:\n" + out2 + err2)
    want = "a block of 32 positions holds %d bytes" % block_bytes(e2e.TARGET, 32)
    check("prefix cache: up to 1.00 GiB of host memory" in out and want in out,
          "the capacity lines show the cache's memory (%s):\n%s" % (want, out))
    check(re.search(r"gpu_memory: .*less prefix_cache_memory=1GiB \(flag:--prefix-cache-memory\)",
                    out), "on the cpu backend gpu_memory auto leaves the cache out:\n" + out)
    rc, out, err = st.run([v, "--model", e2e.TARGET, "--check-config", "--backend", "cpu"])
    check(rc == 0 and "prefix cache: up to" not in out and
          "prefix_cache_memory" not in re.search(r"gpu_memory: .*", out).group(0),
          "off: no cache line, gpu_memory as before:\n" + out)
    # no_buffer: refused, naming both settings and what no_buffer lacks.
    rc, out, err = st.run([v, "--model", e2e.TARGET, "--check-config", "--prefix-cache", "on",
                           "--state-strategy", "no_buffer"])
    check(rc != 0 and "prefix-cache-needs-state" in out + err and
          "inside verified draft blocks" in out + err and
          "state_strategy=no_buffer (flag:--state-strategy)" in out + err,
          "no_buffer with the cache is refused:\n" + out + err)
    rc, out, err = st.run([st.ARGS.gateway, "--check-config"])
    check(rc == 0 and re.search(r"prefix_affinity_slack:\s+4\s+# default", out),
          "the gateway's prefix_affinity_slack:\n" + out + err)


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    for a in ("cli", "gateway", "verifier", "drafter", "source"):
        ap.add_argument("--" + a, required=True)
    a = ap.parse_args()
    a.quick = False
    st.ARGS = a
    st.TMP = tempfile.mkdtemp(prefix="tandem-prefix-")
    e2e.setup_paths()
    t0 = time.time()
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
    print("%s: %.1f s" % (a.case, time.time() - t0))
    if st.FAILURES:
        print("%d check(s) failed" % len(st.FAILURES))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
