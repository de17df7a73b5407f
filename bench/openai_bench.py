#!/usr/bin/python3
"""The OpenAI-compatible HTTP API's cost against the gRPC Generate path: the
three services on loopback with the demo models, the same greedy request
alternately over gRPC (a grpcio stream) and over HTTP (server-sent events,
and a whole response), timed at the client. Prints medians of the time to the
first token, the time per later token and the whole request.

usage: bench/openai_bench.py --build BUILD [--requests N] [--max-tokens N]
"""
import argparse
import http.client
import json
import os
import re
import statistics
import time

from harness import ROOT, st, use_build

PROMPT = "def fibonacci(n):\n    "


def grpc_once(ch, n, spec):
    c = st.client()
    req_cls, resp_cls, _ = c._method("/tandem.v1.Gateway/Generate")
    req = c.json_format.ParseDict({"text": PROMPT, "max_tokens": n, "ignore_eos": True,
                                   "speculation": {"mode": "SPECULATION_MODE_" + spec.upper()}},
                                  req_cls())
    fn = ch.unary_stream("/tandem.v1.Gateway/Generate",
                         request_serializer=req_cls.SerializeToString,
                         response_deserializer=resp_cls.FromString)
    t0 = time.perf_counter()
    first, tokens = None, 0
    for m in fn(req, timeout=120.0):
        if m.HasField("tokens"):
            if first is None:
                first = time.perf_counter() - t0
            tokens += len(m.tokens.ids)
    return first, time.perf_counter() - t0, tokens


def http_once(port, n, spec, stream):
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "stream": stream, "stream_options": {"include_usage": True},
            "tandem": {"speculation": spec}}
    if not stream:
        del body["stream_options"]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    first, tokens = None, 0
    if stream:
        while True:
            line = r.fp.readline()
            if not line:
                break
            if line.startswith(b"data: ") and first is None:
                first = time.perf_counter() - t0
            if line.startswith(b"data: {"):
                ch = json.loads(line[6:])
                if ch.get("usage"):
                    tokens = ch["usage"]["completion_tokens"]
            if line.startswith(b"data: [DONE]"):
                break
    else:
        tokens = json.loads(r.read())["usage"]["completion_tokens"]
    t1 = time.perf_counter()
    c.close()
    return first, t1 - t0, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--speculation", default="off", choices=["off", "on"])
    a = ap.parse_args()
    use_build(a.build, "tandem-openai-bench-")
    models = os.path.join(ROOT, "models")
    try:
        gw = st.gateway("--tokenizer", os.path.join(models, "demo-target", "tokenizer.json"),
                        "--http-listen", "127.0.0.1:0", "--http-model-name", "demo")
        st.replica("verifier", gw, "--model", os.path.join(models, "demo-target"),
                   "--max-draft-tokens", "8")
        st.replica("drafter", gw, "--model", os.path.join(models, "demo-drafter"),
                   "--draft-block-size", "4")
        st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 1, "pair")
        port = int(re.search(r"\(port (\d+),", gw.text()).group(1))
        res = {"grpc": [], "http_sse": [], "http_whole": []}
        ch = st.client().channel(gw.addr())
        for i in range(a.requests + 3):
            r = (grpc_once(ch, a.max_tokens, a.speculation),
                 http_once(port, a.max_tokens, a.speculation, True),
                 http_once(port, a.max_tokens, a.speculation, False))
            if i >= 3:  # warm-up
                for k, v in zip(res, r):
                    res[k].append(v)
        print("%d requests of %d tokens each way, speculation %s, medians:" %
              (a.requests, a.max_tokens, a.speculation))
        print("%-11s %10s %14s %12s" % ("path", "TTFT ms", "ms/later tok", "request ms"))
        for k, v in res.items():
            ttft = [x[0] for x in v if x[0] is not None]
            per = [(x[1] - x[0]) / max(1, x[2] - 1) for x in v if x[0] is not None]
            tot = [x[1] for x in v]
            print("%-11s %10s %14s %12.2f" % (
                k, "%.2f" % (statistics.median(ttft) * 1e3) if ttft else "-",
                "%.3f" % (statistics.median(per) * 1e3) if per else "-",
                statistics.median(tot) * 1e3))
    finally:
        for p in reversed(st.PROCS):
            if p.p.poll() is None:
                p.stop()


if __name__ == "__main__":
    main()
