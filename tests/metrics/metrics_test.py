#!/usr/bin/python3
"""Prometheus metrics of tandem-gateway, tandem-verifier and tandem-drafter,
checked with Prometheus's own tools: the three services run as processes on
loopback with the bundled demo models.

Cases:
  promtool    every service's /metrics passes `promtool check metrics`
              (format and naming lint); the values agree with what the
              client saw (requests by finish reason and error code, draft and
              accepted tokens, speculative rounds, histogram counts), with
              each other (accepted per position sums to accepted tokens,
              buckets are cumulative) and with the configuration (capacity);
              state and KV memory are non-zero while a request runs
  prometheus  a real Prometheus server (Debian's `prometheus`) on loopback
              scrapes the stack; counters read back through its HTTP query
              API (/api/v1/query) equal what the client counted
  config      metrics_listen: auto beside health_listen (rule named in
              --check-config), empty turns the port off, a clash with the
              main or health port stops the start naming both settings

usage: metrics_test.py CASE --cli PATH --gateway PATH --verifier PATH --drafter PATH
                       --source ROOT [--promtool PATH] [--prometheus PATH]
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "services"))
import services_test as st  # noqa: E402  (process and client helpers)

check = st.check
ARGS = None


def demo(name):
    return os.path.join(ARGS.source, "models", name)


def metrics_port(p):
    m = re.search(r"metrics port (\d+)", p.text())
    if not m:
        raise SystemExit("FAIL: %s logged no metrics port:\n%s" % (p.name, p.text()))
    return int(m.group(1))


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        ctype = r.headers.get("Content-Type", "")
        return ctype, r.read().decode("utf-8")


def parse(text):
    """Samples of the text format as {(name, frozenset(labels)): value}, and
    the TYPE of each family."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if not check(m is not None, "unparseable sample line: %r" % line):
            continue
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                      m.group(3) or ""))
        samples[(m.group(1), labels)] = float(m.group(4))
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def series(samples, name):
    return {dict(k[1]).get("position", dict(k[1]).get("le", "")): v
            for k, v in samples.items() if k[0] == name}


def stack():
    tok = os.path.join(demo("demo-target"), "tokenizer.json")
    gw = st.gateway("--tokenizer", tok)
    v = st.replica("verifier", gw, "--model", demo("demo-target"), "--max-draft-tokens", "8",
                   "--max-sequences", "8")
    d = st.replica("drafter", gw, "--model", demo("demo-drafter"), "--draft-block-size", "4")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 1, "verifier/drafter pair")
    return gw, v, d


def generate(gw, prompt, max_tokens=16, mode="SPECULATION_MODE_ON", extra=None):
    req = {"text": prompt, "max_tokens": max_tokens, "ignore_eos": True,
           "speculation": {"mode": mode, "block_size": 4, "fixed_block_size": True}}
    req.update(extra or {})
    c = st.client()
    ch = c.channel(gw.addr())
    try:
        code, details, msgs = c.call_stream(ch, "/tandem.v1.Gateway/Generate", req, 120.0)
    finally:
        ch.close()
    done = [m["complete"] for m in msgs if "complete" in m]
    return code, details, done[0] if done else None


PROMPTS = ["def fibonacci(n):\n    ", "import os\nimport sys\n\n", "class Stack:\n    def "]


def run_requests(gw):
    """Three speculative requests and one the gateway refuses; what the
    client saw of them."""
    seen = {"drafted": 0, "accepted": 0, "spec_rounds": 0, "length": 0, "generated": 0}
    for p in PROMPTS:
        code, details, done = generate(gw, p)
        if not check(code == "OK" and done, "Generate: %s %s" % (code, details)):
            continue
        s = done["stats"]
        seen["drafted"] += int(s.get("drafted_tokens", 0))
        seen["accepted"] += int(s.get("accepted_tokens", 0))
        seen["spec_rounds"] += int(s.get("speculative_rounds", 0))
        seen["generated"] += int(s.get("generated_tokens", 0))
        seen["length"] += done["finish_reason"] == "FINISH_REASON_LENGTH"
    code, details, _ = generate(gw, "")
    check(code == "INVALID_ARGUMENT", "empty prompt refused: %s %s" % (code, details))
    check(seen["length"] == len(PROMPTS) and seen["drafted"] > 0,
          "the requests ran speculatively to max_tokens: %s" % seen)
    return seen


def promtool_check(name, text):
    r = subprocess.run([ARGS.promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(),
          "promtool check metrics on the %s's /metrics: rc %d\n%s%s" %
          (name, r.returncode, r.stdout, r.stderr))


def check_histogram(samples, name, count):
    b = series(samples, name + "_bucket")
    n = value(samples, name + "_count")
    check(n == count, "%s_count %s, want %s" % (name, n, count))
    if not check(b and "+Inf" in b, "%s has buckets up to +Inf: %s" % (name, b)):
        return
    bounds = sorted((float(k), v) for k, v in b.items())
    cum = [v for _, v in bounds]
    check(cum == sorted(cum) and cum[-1] == n, "%s buckets cumulative, +Inf = count: %s" %
          (name, bounds))
    s = value(samples, name + "_sum")
    check(s is not None and s >= 0 and (count == 0 or s > 0), "%s_sum %s" % (name, s))


# ---- cases -------------------------------------------------------------------------

def case_promtool():
    gw, v, d = stack()
    ports = {"gateway": metrics_port(gw), "verifier": metrics_port(v), "drafter": metrics_port(d)}
    # While a long request runs, the batch holds state and KV memory.
    long_done = {}
    t = threading.Thread(target=lambda: long_done.update(
        r=generate(gw, "def main():\n", max_tokens=400, mode="SPECULATION_MODE_OFF")))
    t.start()
    deadline, held = time.time() + 30, None
    while time.time() < deadline and t.is_alive():
        sm, _ = parse(scrape(ports["verifier"])[1])
        if value(sm, "tandem_num_requests_running") == 1 and \
                (value(sm, "tandem_kv_cache_memory_bytes") or 0) > 0:
            held = sm
            break
        time.sleep(0.02)
    t.join()
    check(long_done.get("r", ("",))[0] == "OK", "the long request: %s" % (long_done,))
    if check(held is not None, "the verifier reported a running request"):
        kv = value(held, "tandem_kv_cache_memory_bytes")
        rec = value(held, "tandem_state_memory_bytes", kind="recurrent")
        check(kv and kv > 0 and rec and rec > 0,
              "state and KV memory while a request runs: kv %s, recurrent %s" % (kv, rec))

    seen = run_requests(gw)
    time.sleep(0.3)  # the verifier's counters settle after the last round
    texts = {}
    for role, port in ports.items():
        ctype, text = scrape(port)
        check(ctype.startswith("text/plain") and "version=0.0.4" in ctype,
              "%s Content-Type %r" % (role, ctype))
        texts[role] = text
        promtool_check(role, text)
        sm, types = parse(text)
        info = [dict(k[1]) for k in sm if k[0] == "tandem_build_info"]
        check(len(info) == 1 and info[0]["role"] == role and info[0]["version"] == "0.1.0",
              "%s build info: %s" % (role, info))
        check(types.get("tandem_process_uptime_seconds") == "gauge",
              "%s uptime gauge" % role)

    g, _ = parse(texts["gateway"])
    n_ok = len(PROMPTS) + 1  # and the long one
    check(value(g, "tandem_request_success_total", finished_reason="length") == n_ok,
          "gateway successes by finish reason: %s" %
          {k: x for k, x in g.items() if k[0] == "tandem_request_success_total"})
    check(value(g, "tandem_request_errors_total", code="INVALID_ARGUMENT") == 1,
          "gateway errors by code: %s" %
          {k: x for k, x in g.items() if k[0] == "tandem_request_errors_total"})
    check(value(g, "tandem_gateway_requests_total") == n_ok + 1, "gateway requests total")
    check(value(g, "tandem_gateway_requests_in_flight") == 0, "nothing in flight")
    check(value(g, "tandem_gateway_replicas", role="verifier") == 1 and
          value(g, "tandem_gateway_replicas", role="drafter") == 1, "replicas by role")
    check(value(g, "tandem_generation_tokens_total") == seen["generated"] + 400,
          "generation tokens %s, client saw %d" % (value(g, "tandem_generation_tokens_total"),
                                                   seen["generated"] + 400))
    for h in ("tandem_time_to_first_token_seconds", "tandem_e2e_request_latency_seconds"):
        check_histogram(g, h, n_ok)
    # A token per observation, but those of each request's first chunk.
    itl = value(g, "tandem_inter_token_latency_seconds_count") or 0
    check(0 < itl <= seen["generated"] + 400 - n_ok, "ITL observations %s" % itl)
    check_histogram(g, "tandem_inter_token_latency_seconds", itl)

    vm, vtypes = parse(texts["verifier"])
    check(value(vm, "tandem_spec_decode_num_draft_tokens_total") == seen["drafted"],
          "draft tokens %s, client saw %d" %
          (value(vm, "tandem_spec_decode_num_draft_tokens_total"), seen["drafted"]))
    check(value(vm, "tandem_spec_decode_num_accepted_tokens_total") == seen["accepted"],
          "accepted tokens %s, client saw %d" %
          (value(vm, "tandem_spec_decode_num_accepted_tokens_total"), seen["accepted"]))
    check(value(vm, "tandem_spec_decode_num_drafts_total") == seen["spec_rounds"],
          "drafts %s, client saw %d speculative rounds" %
          (value(vm, "tandem_spec_decode_num_drafts_total"), seen["spec_rounds"]))
    pos = series(vm, "tandem_spec_decode_num_accepted_tokens_per_pos_total")
    check(sorted(pos) == [str(i) for i in range(8)], "a position label per draft: %s" % pos)
    per = [pos.get(str(i), 0) for i in range(8)]
    check(sum(per) == seen["accepted"] and per == sorted(per, reverse=True) and
          all(x == 0 for x in per[4:]),
          "accepted per position %s: sums to %d, falls with position, none past block 4" %
          (per, seen["accepted"]))
    sr = value(vm, "tandem_verifier_speculative_rounds_total")
    rounds = value(vm, "tandem_verifier_rounds_total")
    check(sr and 0 < sr <= rounds, "speculative rounds %s of %s" % (sr, rounds))
    check(value(vm, "tandem_spec_decode_adaptive_off_rounds_total") is not None and
          value(vm, "tandem_spec_decode_adaptive_switch_offs_total") is not None,
          "adaptive-rule counters exported")
    check(value(vm, "tandem_num_requests_max") == 8, "capacity = max_sequences")
    check(value(vm, "tandem_num_requests_running") == 0 and
          value(vm, "tandem_num_requests_waiting") == 0, "batch empty at the end")
    check(value(vm, "tandem_kv_cache_memory_bytes") == 0, "no KV memory held at the end")
    check((value(vm, "tandem_model_weight_memory_bytes") or 0) > 0, "weight memory")
    check(value(vm, "tandem_verifier_request_success_total", finished_reason="length") == n_ok,
          "verifier successes by finish reason")
    check_histogram(vm, "tandem_request_queue_time_seconds", n_ok)
    check(vtypes.get("tandem_verifier_round_phase_seconds") == "summary", "round timeline type")
    for phase in ("idle", "admit", "prefill", "wait", "step", "commit", "send"):
        check(value(vm, "tandem_verifier_round_phase_seconds_count", phase=phase) == rounds,
              "phase %s count = rounds" % phase)
        q = value(vm, "tandem_verifier_round_phase_seconds", phase=phase, quantile="0.99")
        check(q is not None and q >= 0, "phase %s p99 %s" % (phase, q))
    step = value(vm, "tandem_verifier_round_phase_seconds_sum", phase="step")
    check(step and step > 0, "time in the step phase: %s" % step)
    total = sum(value(vm, "tandem_verifier_round_phase_seconds_sum", phase=p) or 0
                for p in ("idle", "admit", "prefill", "wait", "step", "commit", "send"))
    up = value(vm, "tandem_verifier_scheduler_uptime_seconds") or 0
    check(up > 0 and abs(total - up) < 0.05 * up + 0.01,
          "the phases add up to the scheduler's uptime: %s vs %s" % (total, up))
    check(not [k for k in vm if re.match(r"tandem_verifier_round_\w+_us", k[0])],
          "no microsecond names")

    # The README's list is what the services export: no more, no less.
    with open(os.path.join(ARGS.source, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("## Metrics"):]
    section = section[:section.index("\n## ", 1)]
    documented = set(re.findall(r"`(tandem_[a-z0-9_]+)", section))
    exported = set()
    for text in texts.values():
        exported |= set(parse(text)[1])
    check(exported - documented == set(), "exported but not in the README's metrics: %s" %
          sorted(exported - documented))
    check(documented - exported == set(), "in the README's metrics but not exported: %s" %
          sorted(documented - exported))

    dm, _ = parse(texts["drafter"])
    blocks = value(dm, "tandem_drafter_blocks_total")
    check(blocks and blocks >= seen["spec_rounds"], "drafter blocks %s" % blocks)
    check(value(dm, "tandem_drafter_sequences_max") == 64, "drafter capacity")
    check((value(dm, "tandem_drafter_block_duration_seconds_count") or 0) > 0,
          "drafter block durations observed")
    check(value(dm, "tandem_registered") == 1, "drafter registered")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8"))


def case_prometheus():
    gw, v, d = stack()
    targets = {"tandem-gateway": metrics_port(gw), "tandem-verifier": metrics_port(v),
               "tandem-drafter": metrics_port(d)}
    cfg = "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
    for job, port in targets.items():
        cfg += "  - job_name: %s\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n" % (
            job, port)
    path = st.write("prometheus.yml", cfg)
    r = subprocess.run([ARGS.promtool, "check", "config", path], capture_output=True, text=True)
    check(r.returncode == 0, "promtool check config: %s%s" % (r.stdout, r.stderr))
    web = free_port()
    log = open(os.path.join(st.TMP, "prometheus.log"), "wb")
    prom = subprocess.Popen([ARGS.prometheus, "--config.file=" + path,
                             "--storage.tsdb.path=" + os.path.join(st.TMP, "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % web,
                             "--storage.tsdb.retention.time=1h"],
                            stdout=log, stderr=log)
    base = "http://127.0.0.1:%d" % web
    try:
        deadline = time.time() + 30
        up = {}
        while time.time() < deadline:
            try:
                t = http_json(base + "/api/v1/targets")
                up = {a["labels"]["job"]: a["health"] for a in t["data"]["activeTargets"]}
                if len(up) == 3 and all(h == "up" for h in up.values()):
                    break
            except OSError:
                pass
            if prom.poll() is not None:
                break
            time.sleep(0.2)
        if not check(len(up) == 3 and all(h == "up" for h in up.values()),
                     "Prometheus scrapes all three services: %s" % up):
            return
        seen = run_requests(gw)

        def query(q):
            j = http_json(base + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
            res = j["data"]["result"]
            return float(res[0]["value"][1]) if res else None

        want = {
            'sum(tandem_request_success_total{job="tandem-gateway"})': len(PROMPTS),
            'tandem_request_errors_total{code="INVALID_ARGUMENT"}': 1,
            "tandem_spec_decode_num_draft_tokens_total": seen["drafted"],
            "sum(tandem_spec_decode_num_accepted_tokens_per_pos_total)": seen["accepted"],
            'count(up{job=~"tandem-.*"} == 1)': 3,
        }
        got = {}
        deadline = time.time() + 20
        while time.time() < deadline:
            got = {q: query(q) for q in want}
            if got == {q: float(x) for q, x in want.items()}:
                break
            time.sleep(0.5)
        for q, x in want.items():
            check(got.get(q) == x, "Prometheus query %s = %s, want %s" % (q, got.get(q), x))
        # The round timeline is there to graph, in seconds.
        step = query('tandem_verifier_round_phase_seconds_sum{phase="step"}')
        check(step is not None and step > 0, "round timeline in Prometheus: %s" % step)
    finally:
        prom.terminate()
        try:
            prom.wait(15)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
        if st.FAILURES:
            with open(os.path.join(st.TMP, "prometheus.log"), "rb") as f:
                print("---- prometheus log\n" + f.read().decode("utf-8", "replace")[-4000:])


def case_config():
    vbin = ARGS.verifier
    rc, out, err = st.run([vbin, "--model", demo("demo-target"), "--health-listen",
                           "127.0.0.1:9301", "--check-config"])
    check(rc == 0 and re.search(r"metrics_listen:\s+127\.0\.0\.1:9302 ", out) and
          "metrics-beside-health" in out,
          "auto beside health in --check-config:\n" + out)
    rc, out, err = st.run([vbin, "--model", demo("demo-target"), "--listen", "127.0.0.1:9400",
                           "--metrics-listen", "127.0.0.1:9400", "--check-config"])
    check(rc == 1 and "check separate-metrics-port" in out and
          "metrics_listen=127.0.0.1:9400 (flag:--metrics-listen)" in out and
          "listen=127.0.0.1:9400 (flag:--listen)" in out,
          "a metrics port that is the main port is refused naming both:\n" + out)
    rc, out, err = st.run([ARGS.gateway, "--metrics-listen", "nohost", "--check-config"])
    check(rc == 1 and "metrics_listen" in out, "a malformed address is refused:\n" + out)
    # Empty: no metrics port at all.
    gw = st.start("gateway", "--metrics-listen", "")
    check("metrics off" in gw.text(), "metrics off is logged:\n" + gw.text())
    # A busy port stops the start with a message that names it.
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    p = st.start("gateway", "--metrics-listen", "127.0.0.1:%d" % port, ready=False)
    try:
        rc = p.p.wait(15)
    except subprocess.TimeoutExpired:
        rc = None
    busy.close()
    check(rc == 1 and ("127.0.0.1:%d" % port) in p.text() and "metrics" in p.text(),
          "a busy metrics port: rc %s\n%s" % (rc, p.text()))
    # A path that is not /metrics is 404, another method 405.
    port = metrics_port(st.start("gateway"))
    for method, path, want in (("GET", "/nope", 404), ("POST", "/metrics", 405)):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method,
                                     data=b"" if method == "POST" else None)
        try:
            urllib.request.urlopen(req, timeout=5)
            code = 200
        except urllib.error.HTTPError as e:
            code = e.code
        check(code == want, "%s %s answered %s, want %s" % (method, path, code, want))


CASES = {"promtool": case_promtool, "prometheus": case_prometheus, "config": case_config}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    for a in ("cli", "gateway", "verifier", "drafter", "source"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ARGS = ap.parse_args()
    st.ARGS = ARGS
    st.TMP = tempfile.mkdtemp(prefix="tandem-metrics-")
    for tool in (ARGS.promtool, ARGS.prometheus):
        if not os.access(tool, os.X_OK):
            print("FAIL: %s not found (Debian package prometheus; scripts/deps.sh installs it)"
                  % tool)
            return 1
    t0 = time.time()
    try:
        CASES[ARGS.case]()
    finally:
        for p in reversed(st.PROCS):
            if p.p.poll() is None:
                rc = p.stop()
                check(rc == 0, "%s exits 0 on SIGTERM (rc %s)" % (p.name, rc))
            elif not p.log.closed:
                p.log.close()
        if st.FAILURES:
            for p in st.PROCS:
                print("---- log of %s (%s)\n%s" % (p.name, p.log_path, p.text()[-4000:]))
        shutil.rmtree(st.TMP, ignore_errors=True)
    print("%s: %.1f s, %d failure(s)" % (ARGS.case, time.time() - t0, len(st.FAILURES)))
    return 1 if st.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
