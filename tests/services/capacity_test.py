#!/usr/bin/python3
"""A verifier's memory, accounted before serving, end to end: the capacity
arithmetic --check-config prints against an independent reference (DESIGN.md
section 3's state shapes from config.json), max_sequences above the capacity
refused naming both values and their sources, and a small gpu_memory that
makes the verifier queue one request and refuse another with
RESOURCE_EXHAUSTED naming the limits while the others run to the end.

Runs on services_test.py's harness (processes, gRPC client, status).

usage: capacity_test.py capacity --cli PATH --gateway PATH --verifier PATH --drafter PATH
                        --source ROOT
"""
import json
import os
import re
import threading
import time

import services_test as st
from services_test import binary, check, client, gateway, replica, run, wait_status

def demo_seq_bytes(cfg, strategy, k, positions):
    """Bytes of one sequence's state, from config.json and DESIGN.md section 3
    (fp32 states): per linear layer a conv window (K-1) x conv_dim and a
    recurrent matrix Hv x Dk x Dv, plus the strategy's copies; per attention
    layer K and V for every position."""
    types = cfg["layer_types"]
    n_lin = sum(1 for t in types if t == "linear_attention")
    n_full = len(types) - n_lin
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv = (cfg["linear_conv_kernel_dim"] - 1) * (2 * hk * dk + hv * dv)
    rec = hv * dk * dv
    if strategy == "extra_buffer":
        extra = (k + 1) * (conv + rec)
    elif strategy == "no_buffer":
        extra = conv + rec
    else:  # replay: conv windows per position, and per position k, v, decay, beta, 1/|k|
        rows = hk * dk + hv * dv + 2 * hv + hk
        extra = (k + 1) * (conv + (rows + 3) // 4 * 4)
    kv = 2 * positions * cfg["num_key_value_heads"] * cfg["head_dim"] * n_full
    return 4 * (kv + n_lin * (conv + rec + extra))


def capacity_terms(out):
    """The numbers --check-config prints for the capacity."""
    terms = {}
    for key, pat in (("seq", r"per sequence .*= (\d+) bytes"), ("weights", r"weights: (\d+) bytes"),
                     ("workspace", r"workspace of the largest step \((\d+) rows\): (\d+) bytes"),
                     ("budget", r"budget: (\d+) bytes"), ("max", r"max sequences: (\d+) =")):
        m = re.search(pat, out)
        if check(m is not None, "check-config prints %s:\n%s" % (key, out)):
            terms[key] = int(m.group(m.lastindex))
    return terms


def case_capacity():
    v = binary("tandem-verifier")
    m = os.path.join(st.ARGS.source, "models", "demo-target")
    with open(os.path.join(m, "config.json")) as f:
        cfg = json.load(f)
    ctx, k = 1024, 8
    # The per-sequence arithmetic against an independent reference, for each
    # strategy.
    for strat in ("extra_buffer", "no_buffer", "replay"):
        rc, out, err = run([v, "--check-config", "--model", m, "--max-context", str(ctx),
                            "--state-strategy", strat, "--gpu-memory", "1GiB"])
        t = capacity_terms(out)
        want = demo_seq_bytes(cfg, strat, k, ctx)
        check(rc == 0 and t.get("seq") == want,
              "%s: per-sequence bytes %s, reference %d:\n%s" % (strat, t.get("seq"), want, out))
        line = [ln for ln in out.splitlines() if ln.startswith("max_sequences:")]
        check(len(line) == 1 and "rule max-sequences-from-capacity" in line[0] and
              "gpu_memory=1GiB (flag:--gpu-memory)" in line[0] and
              re.search(r"^max_sequences: +%d +#" % t.get("max", -1), line[0]) is not None,
              "max_sequences auto is the capacity, with its reason: %s" % line)
    # A budget that holds exactly two sequences beside the weights and the
    # workspace of their largest step, which depends on the count: settled
    # in a few rounds.
    t = capacity_terms(out)
    for _ in range(5):
        budget = t["weights"] + t["workspace"] + 2 * t["seq"] + t["seq"] // 2
        base = [v, "--model", m, "--max-context", str(ctx), "--gpu-memory", str(budget)]
        rc, out, err = run(base + ["--check-config"])
        t = capacity_terms(out)
        if t.get("max") == 2:
            break
    check(rc == 0 and t.get("max") == 2 and t.get("budget") == budget,
          "a budget of %d holds 2 sequences:\n%s" % (budget, out))
    check(re.search(r"^max_sequences: +2 +# auto", out, re.M) is not None, "auto gives 2:\n" + out)
    # max_sequences above the capacity: refused naming both values and sources.
    rc, out, err = run(base + ["--check-config", "--max-sequences", "3"])
    check(rc != 0 and "max_sequences=3 (flag:--max-sequences)" in out and
          "capacity of 2 sequences" in out and
          ("gpu_memory=%d (flag:--gpu-memory)" % budget) in out and
          "max-sequences-within-capacity" in out, "above the capacity:\n" + out)
    rc, out, err = run(base + ["--max-sequences", "3", "--listen", "127.0.0.1:0",
                               "--health-listen", "127.0.0.1:0"])
    check(rc == 2 and "max_sequences=3 (flag:--max-sequences)" in err and
          "capacity of 2 sequences" in err, "start-up refused:\n" + err)
    rc, out, err = run(base + ["--check-config", "--max-sequences", "2"])
    check(rc == 0, "max_sequences at the capacity is fine:\n" + out)
    # Serving with that budget and a line of one: two run, one waits, one is
    # refused naming the limits; the others go on to the end.
    gw = gateway()
    ver = replica("verifier", gw, "--model", m, "--max-context", str(ctx), "--gpu-memory",
                  str(budget), "--max-waiting", "1", "--replica-id", "v-cap")
    check("capacity: max sequences: 2 =" in ver.text(), "start-up logs the capacity:\n" +
          ver.text())
    results = {}
    started = []

    def one(i):
        c = client()
        ch = c.channel(ver.addr())
        req = {"request_id": "r%d" % i, "prompt_ids": [5, 6, 7, 8], "max_tokens": 900}
        try:
            code, details, msgs = c.call_stream(ch, "/tandem.v1.Verifier/Run", req, 120.0)
        finally:
            ch.close()
        n = sum(len(x["tokens"]["ids"]) for x in msgs if "tokens" in x)
        results[i] = (code, details, n)

    def load():
        c = st.counters(ver.addr(), "/tandem.v1.Verifier/Describe")
        return c.get("active_sequences", 0) + c.get("waiting_sequences", 0)

    # Each request starts once the ones before it are in (a thread that
    # starts late must not change who is refused).
    for i in range(4):
        th = threading.Thread(target=one, args=(i,))
        th.start()
        started.append(th)
        deadline = time.time() + 10
        while i < 3 and load() < i + 1 and time.time() < deadline and th.is_alive():
            time.sleep(0.005)
    for th in started:
        th.join(150)
    codes = sorted(r[0] for r in results.values())
    check(codes == ["OK", "OK", "OK", "RESOURCE_EXHAUSTED"],
          "three served, one refused: %s" % results)
    for code, details, n in results.values():
        if code == "OK":
            check(n == 900, "a served request got all its tokens: %d" % n)
        else:
            check("max_waiting=1 (flag:--max-waiting)" in details and
                  "max_sequences=2 (auto" in details and
                  ("gpu_memory=%d (flag:--gpu-memory)" % budget) in details,
                  "the refusal names the limits: %s" % details)
    # tandem status shows the capacity the verifier computed.
    s = wait_status(gw, lambda s: any(
        c["name"] == "refused_queue_full" and c["value"] >= 1
        for r in s.get("replicas", []) for c in (r.get("load") or {}).get("counters", [])),
        "the verifier's counters in the status")
    rc, out, err = run([binary("tandem"), "status", "--gateway", gw.addr()])
    check(rc == 0 and ("capacity 2 sequences in " in out) and
          ("(%d bytes): weights" % budget) in out and ("(%d bytes: kv " % t["seq"]) in out,
          "tandem status shows the capacity:\n" + out)



st.CASES["capacity"] = case_capacity

if __name__ == "__main__":
    st.main()
