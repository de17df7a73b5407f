#!/usr/bin/python3
"""Soak: many concurrent streams against the local stack (demo models, CPU)
for a long time, with a fault injected every so often, while the services'
memory is sampled. Not part of the test suite; results go to bench/RESULTS.md.

Each client thread loops: one greedy Generate (speculative for three streams
in four), checked against the plain output of its prompt (a completed
request must equal it, a failed one must have streamed a prefix of it).
Faults rotate: SIGKILL of the drafter (restarted), SIGSTOP of the drafter for
3 s, SIGSTOP of one of the two verifiers for 3 s, SIGKILL of that verifier
(restarted).

usage: bench/soak.py --build BUILD_DIR [--streams 256] [--minutes 10] [--fault-every 30]
"""
import argparse
import os
import signal
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "tests", "services"))
import services_test as st  # noqa: E402
import e2e_test as e2e  # noqa: E402


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p / 100))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--fault-every", type=float, default=30)
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    b = os.path.abspath(a.build)
    st.ARGS = argparse.Namespace(cli=b + "/services/cli/tandem",
                                 gateway=b + "/services/gateway/tandem-gateway",
                                 verifier=b + "/services/verifier/tandem-verifier",
                                 drafter=b + "/services/drafter/tandem-drafter", source=ROOT)
    st.TMP = tempfile.mkdtemp(prefix="tandem-soak-")
    e2e.setup_paths()
    gw = st.gateway("--tokenizer", e2e.TOKENIZER, "--heartbeat-interval", "250ms",
                    "--replica-ttl", "2s")
    vargs = ("--model", e2e.TARGET, "--max-sequences", "256", "--draft-timeout", "1s")
    procs = {"v1": st.replica("verifier", gw, *vargs, "--replica-id", "v1"),
             "v2": st.replica("verifier", gw, *vargs, "--replica-id", "v2"),
             "d1": st.replica("drafter", gw, "--model", e2e.DRAFTER, "--replica-id", "d1",
                              "--max-sequences", "512")}
    st.wait_status(gw, lambda s: len([p for p in s.get("pairs", []) if p["compatible"]]) >= 2,
                   "two pairs")
    ps = e2e.prompts(32)
    refs = [e2e.generate(gw, p, max_tokens=a.tokens, mode="SPECULATION_MODE_OFF",
                         ignore_eos=True)[2] for p in ps]
    stop = threading.Event()
    lock = threading.Lock()
    codes, lat, wrong = {}, [], [0]

    def client(i):
        k = i
        while not stop.is_set():
            p = k % len(ps)
            k += a.streams
            t0 = time.time()
            r = e2e.generate(gw, ps[p], max_tokens=a.tokens, ignore_eos=True, timeout=60,
                             mode="SPECULATION_MODE_OFF" if i % 4 == 0
                             else "SPECULATION_MODE_AUTO")
            dt = time.time() - t0
            bad = (r[2] != refs[p]) if r[0] == "OK" else (r[2] != refs[p][:len(r[2])])
            with lock:
                codes[r[0]] = codes.get(r[0], 0) + 1
                if r[0] == "OK":
                    lat.append(dt)
                wrong[0] += bad

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(a.streams)]
    for t in threads:
        t.start()
    t_start = time.time()
    faults = ["drafter SIGKILL", "drafter SIGSTOP 3 s", "verifier SIGSTOP 3 s",
              "verifier SIGKILL"]
    fi = 0
    next_fault = t_start + a.fault_every
    samples = []
    print("| t (s) | requests | by status | p50 s | p99 s | RSS gateway / v1 / v2 / d1 (MB) | "
          "fault |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    while time.time() - t_start < a.minutes * 60:
        time.sleep(1)
        now = time.time()
        fault = ""
        if now >= next_fault:
            fault = faults[fi % len(faults)]
            fi += 1
            next_fault = now + a.fault_every
            if fault == "drafter SIGKILL":
                procs["d1"].p.send_signal(signal.SIGKILL)
                procs["d1"].p.wait()
                procs["d1"] = st.replica("drafter", gw, "--model", e2e.DRAFTER,
                                         "--replica-id", "d1", "--max-sequences", "512")
            elif fault == "drafter SIGSTOP 3 s":
                procs["d1"].p.send_signal(signal.SIGSTOP)
                time.sleep(3)
                procs["d1"].p.send_signal(signal.SIGCONT)
            elif fault == "verifier SIGSTOP 3 s":
                procs["v2"].p.send_signal(signal.SIGSTOP)
                time.sleep(3)
                procs["v2"].p.send_signal(signal.SIGCONT)
            else:
                procs["v2"].p.send_signal(signal.SIGKILL)
                procs["v2"].p.wait()
                procs["v2"] = st.replica("verifier", gw, *vargs, "--replica-id", "v2")
        if int(now - t_start) % 30 == 0 or fault:
            with lock:
                total = sum(codes.values())
                row = (int(now - t_start), total, dict(codes), pct(lat, 50), pct(lat, 99))
            mem = [rss_kb(x.p.pid) / 1024 for x in (gw, procs["v1"], procs["v2"], procs["d1"])]
            samples.append(mem)
            print("| %d | %d | %s | %.2f | %.2f | %s | %s |" %
                  (row + (" / ".join("%.0f" % m for m in mem), fault)), flush=True)
    stop.set()
    for t in threads:
        t.join(90)
    print("\nrequests: %d, by status %s, wrong or repeated tokens: %d, latency p50 %.2f s, "
          "p99 %.2f s" % (sum(codes.values()), codes, wrong[0], pct(lat, 50), pct(lat, 99)))
    e2e.stop_all()
    return 1 if wrong[0] else 0


if __name__ == "__main__":
    sys.exit(main())
