#!/usr/bin/python3
"""The gateway's OpenAI-compatible HTTP API (http_listen), with the three
services as processes on loopback and the bundled demo models.

Cases:
  http  curl and plain HTTP: /v1/models, /health, completions and chat
        completions whole and streamed (server-sent events ending with
        data: [DONE], the usage chunk with empty choices), greedy text equal
        to the gRPC Generate's for the same request, stop strings, the tandem
        extension (speculation stats); errors as OpenAI error objects with
        the right status (malformed JSON, wrong types naming the field, an
        unknown model, n > 1, a body over http_max_body) while other requests
        go on; a client that disconnects (mid-stream, or before its whole
        response) cancels its sequence on verifier and drafter
  auth  api_tokens_file guards the HTTP API as it does gRPC (401), /health
        and completions answer 503 without a verifier; HTTPS with tls_cert and
        tls_key (curl with the certificate as its CA)
  sdk   the official `openai` npm package (installed with npm into the build
        folder once, then cached): completions and chat, whole and streamed,
        equal to the gRPC API's greedy output; skipped (a message, exit 77:
        ctest reports it skipped) when npm cannot install it

usage: openai_test.py CASE --cli PATH --gateway PATH --verifier PATH --drafter PATH
                      --source ROOT --work DIR
"""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "services"))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import services_test as st  # noqa: E402  (process and client helpers)
from e2e_test import counter  # noqa: E402  (a Describe or GetStatus counter)

check = st.check
ARGS = None
SKIPPED = 77  # ctest's SKIP_RETURN_CODE for this test
MODEL = "demo"
PROMPT = "def fibonacci(n):\n    "


def gw_settled(gw, timeout=10.0):
    """Waits until the gateway has counted every request it started (each as
    completed, failed or cancelled)."""
    path = "/tandem.v1.Gateway/GetStatus"
    deadline = time.time() + timeout
    while time.time() < deadline:
        ended = sum(counter(gw.addr(), path, "generate_" + k)
                    for k in ("completed", "failed", "cancelled"))
        if ended >= counter(gw.addr(), path, "generate_requests"):
            return
        time.sleep(0.01)
    check(False, "the gateway still had requests in flight after %.0f s" % timeout)


def demo(name):
    return os.path.join(ARGS.source, "models", name)


def http_port(gw, scheme=""):
    """The HTTP port the gateway logged (the line may follow the gRPC one)."""
    deadline = time.time() + 10
    while True:
        m = re.search(r"OpenAI-compatible API on \S+ \(port (\d+), %s" % scheme, gw.text())
        if m or time.time() > deadline:
            return m
        time.sleep(0.05)


def stack():
    tok = os.path.join(demo("demo-target"), "tokenizer.json")
    gw = st.gateway("--tokenizer", tok, "--http-listen", "127.0.0.1:0", "--http-model-name", MODEL,
                    "--http-max-body", "64KiB")
    v = st.replica("verifier", gw, "--model", demo("demo-target"), "--max-draft-tokens", "8",
                   "--max-sequences", "8")
    d = st.replica("drafter", gw, "--model", demo("demo-drafter"), "--draft-block-size", "4")
    st.wait_status(gw, lambda s: len(s.get("pairs", [])) >= 1, "verifier/drafter pair")
    m = http_port(gw)
    if not m:
        raise SystemExit("FAIL: the gateway logged no HTTP port:\n" + gw.text())
    return gw, v, d, int(m.group(1))


def post(port, path, body, raw=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else json.dumps(body).encode()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read().decode("utf-8", "replace")
    c.close()
    return r.status, r.getheader("Content-Type", ""), out


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    out = r.read().decode()
    c.close()
    return r.status, out


def events(text):
    """The data: payloads of an SSE body."""
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def grpc_text(gw, req):
    c = st.client()
    ch = c.channel(gw.addr())
    try:
        code, details, msgs = c.call_stream(ch, "/tandem.v1.Gateway/Generate", req, 120.0)
    finally:
        ch.close()
    check(code == "OK", "gRPC Generate: %s %s" % (code, details))
    text = "".join(m["tokens"].get("text", "") for m in msgs if "tokens" in m)
    done = [m["complete"] for m in msgs if "complete" in m]
    return text, done[0] if done else {}


def chat_messages():
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}]


def expect_error(port, body, status, param=None, raw=None, what=""):
    code, ctype, out = post(port, "/v1/completions", body, raw=raw)
    try:
        e = json.loads(out)["error"]
    except (ValueError, KeyError, TypeError):
        e = None
    check(code == status and e is not None and "message" in e and "type" in e,
          "%s: status %d (want %d) with an error object: %s" % (what, code, status, out[:300]))
    if param and e:
        check(e.get("param") == param, "%s: the error names %s: %s" % (what, param, e))
    check("application/json" in ctype, "%s: the error is JSON (%s)" % (what, ctype))


def case_http():
    gw, v, d, port = stack()
    n = 24
    # /v1/models and /health
    code, out = get(port, "/v1/models")
    models = json.loads(out)
    check(code == 200 and models["object"] == "list" and models["data"][0]["id"] == MODEL,
          "/v1/models: %d %s" % (code, out))
    code, out = get(port, "/health")
    check(code == 200 and json.loads(out)["status"] == "ok", "/health: %d %s" % (code, out))

    # Greedy text over HTTP equals gRPC's, whole and streamed.
    ref, ref_done = grpc_text(gw, {"text": PROMPT, "max_tokens": n})
    check(len(ref) > 0, "gRPC produced text")
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": n, "temperature": 0}
    code, _, out = post(port, "/v1/completions", body)
    r = json.loads(out) if code == 200 else {}
    check(code == 200 and r.get("object") == "text_completion", "completion: %d %s" % (code, out))
    if r:
        check(r["choices"][0]["text"] == ref,
              "completion text equals gRPC's: %r vs %r" % (r["choices"][0]["text"], ref))
        u = r["usage"]
        check(u["completion_tokens"] == int(ref_done["stats"]["generated_tokens"]) and
              u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] +
              u["completion_tokens"], "usage: %s" % u)
        check(r["choices"][0]["finish_reason"] in ("length", "stop"), "finish_reason: %s" % r)
        x = r.get("tandem", {})
        check("drafted_tokens" in x and "acceptance_by_position" in x and
              "mean_accepted_length" in x, "the tandem extension has speculation stats: %s" % x)
    # Speculation off and on give the same greedy text; on drafts.
    for mode in ("off", "on"):
        b = dict(body, tandem={"speculation": mode, "block_size": 4, "fixed_block_size": True})
        code, _, out = post(port, "/v1/completions", b)
        r = json.loads(out) if code == 200 else {}
        check(code == 200 and r["choices"][0]["text"] == ref,
              "speculation %s: same text: %d %s" % (mode, code, out[:300]))
        if mode == "on" and r:
            x = r["tandem"]
            check(x["drafted_tokens"] > 0 and len(x["acceptance_by_position"]) > 0,
                  "speculation on drafted: %s" % x)
    # Prompt as token ids.
    ids = st.unary(gw.addr(), "/tandem.v1.Gateway/Tokenize", {"text": PROMPT})[2]["ids"]
    code, _, out = post(port, "/v1/completions", dict(body, prompt=[int(i) for i in ids]))
    check(code == 200 and json.loads(out)["choices"][0]["text"] == ref,
          "token-id prompt: %d %s" % (code, out[:300]))

    # Streamed with curl: SSE, deltas join to the same text, usage chunk last.
    sb = dict(body, stream=True, stream_options={"include_usage": True})
    p = subprocess.run(["curl", "-sS", "-N", "http://127.0.0.1:%d/v1/completions" % port,
                        "-H", "Content-Type: application/json", "-d", json.dumps(sb)],
                       capture_output=True, text=True, timeout=60)
    ev = events(p.stdout)
    check(p.returncode == 0 and ev and ev[-1] == "[DONE]", "curl stream ends with [DONE]: %r"
          % p.stdout[-300:])
    chunks = [json.loads(e) for e in ev[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    check(text == ref, "streamed text equals gRPC's: %r vs %r" % (text, ref))
    check(chunks and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] ==
          int(ref_done["stats"]["generated_tokens"]), "the last chunk carries usage: %s"
          % (chunks[-1] if chunks else None))
    fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and
           c["choices"][0]["finish_reason"]]
    check(len(fin) == 1, "one chunk has a finish_reason: %s" % fin)

    # Chat: the same as gRPC's chat prompt (ChatML from the tokenizer).
    cref, _ = grpc_text(gw, {"chat": {"messages": chat_messages(), "add_generation_prompt": True},
                             "max_tokens": n, "ignore_eos": True})
    # ignore_eos: the demo model (trained on code) ends a chat turn at once.
    cb = {"model": MODEL, "messages": chat_messages(), "max_tokens": n, "temperature": 0,
          "ignore_eos": True}
    check(len(cref) > 0, "gRPC produced chat text")
    code, _, out = post(port, "/v1/chat/completions", cb)
    r = json.loads(out) if code == 200 else {}
    check(code == 200 and r.get("object") == "chat.completion" and
          r["choices"][0]["message"]["role"] == "assistant" and
          r["choices"][0]["message"]["content"] == cref, "chat: %d %s vs %r" % (code, out, cref))
    code, _, out = post(port, "/v1/chat/completions", dict(cb, stream=True))
    ev = events(out)
    chunks = [json.loads(e) for e in ev[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    check(code == 200 and ev[-1] == "[DONE]" and text == cref and
          chunks[0]["choices"][0]["delta"].get("role") == "assistant" and
          chunks[0]["object"] == "chat.completion.chunk", "chat stream: %r vs %r" % (text, cref))
    # Content as text parts.
    parts = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": [{"type": "text", "text": PROMPT[:5]},
                                          {"type": "text", "text": PROMPT[5:]}]}]
    code, _, out = post(port, "/v1/chat/completions", dict(cb, messages=parts))
    check(code == 200 and json.loads(out)["choices"][0]["message"]["content"] == cref,
          "chat content parts: %d %s" % (code, out[:200]))

    # A stop string cuts the text before it, finish_reason stop.
    if len(ref) > 6:
        stop = ref[3:6]
        code, _, out = post(port, "/v1/completions", dict(body, stop=[stop]))
        r = json.loads(out) if code == 200 else {}
        check(code == 200 and r["choices"][0]["text"] == ref[:ref.index(stop)] and
              r["choices"][0]["finish_reason"] == "stop", "stop %r: %s" % (stop, out[:300]))

    # Errors, each answered while the server goes on.
    expect_error(port, None, 400, raw=b'{"model": "demo", "prompt": ', what="malformed JSON")
    expect_error(port, None, 400, raw=b'[1, 2]', what="not an object")
    expect_error(port, dict(body, max_tokens="many"), 400, "max_tokens", what="max_tokens string")
    expect_error(port, dict(body, temperature=7), 400, "temperature", what="temperature range")
    expect_error(port, dict(body, prompt={"a": 1}), 400, "prompt", what="prompt object")
    expect_error(port, dict(body, stop=[1]), 400, "stop", what="stop number")
    expect_error(port, dict(body, n=2), 400, "n", what="n = 2")
    expect_error(port, {"prompt": PROMPT}, 400, "model", what="no model")
    expect_error(port, dict(body, model="gpt-4"), 404, "model", what="unknown model")
    expect_error(port, dict(body, tandem={"speculation": "maybe"}), 400, "tandem.speculation",
                 what="bad speculation mode")
    expect_error(port, dict(body, prompt="x" * (100 << 10)), 413, what="huge body")
    expect_error(port, dict(body, prompt=""), 400, "prompt", what="empty prompt")
    code, _, out = post(port, "/v1/chat/completions", dict(cb, messages=[{"role": "wizard",
                                                                           "content": "x"}]))
    check(code == 400 and json.loads(out)["error"]["param"] == "messages", "bad role: %s" % out)
    code, out = get(port, "/v1/nothing")
    check(code == 404 and "error" in json.loads(out), "unknown path: %d %s" % (code, out))
    # A slow client (half a body, then silence) and a long stream hold only
    # their own connections.
    slow = socket.create_connection(("127.0.0.1", port), timeout=30)
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"mo")
    busy = socket.create_connection(("127.0.0.1", port), timeout=30)
    busy_req = json.dumps(dict(body, max_tokens=4000, ignore_eos=True, stream=True)).encode()
    busy.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n" % len(busy_req) + busy_req)
    busy.recv(4096)
    code, _, out = post(port, "/v1/completions", body)
    check(code == 200 and json.loads(out)["choices"][0]["text"] == ref,
          "a request after the errors, beside a slow client and a long stream, is served: %d %s"
          % (code, out[:200]))
    slow.close()
    busy.close()
    deadline = time.time() + 10
    while time.time() < deadline and \
            counter(v.addr(), "/tandem.v1.Verifier/Describe", "active_sequences") != 0:
        time.sleep(0.01)

    # A client that disconnects mid-stream cancels its sequence. The gateway
    # counts a request as it ends, which may come after the verifier freed its
    # sequence: the closes above are counted before the baseline is read.
    gw_settled(gw)
    cancelled = counter(gw.addr(), "/tandem.v1.Gateway/GetStatus", "generate_cancelled")
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    long_req = json.dumps(dict(body, max_tokens=4000, ignore_eos=True, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(long_req) + long_req)
    got = b""
    while got.count(b"data: ") < 2:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    check(b"200 OK" in got, "the long stream started: %r" % got[:200])
    s.close()
    t_close = time.time()
    freed = None
    while time.time() - t_close < 10.0:
        a = counter(v.addr(), "/tandem.v1.Verifier/Describe", "active_sequences")
        b = counter(d.addr(), "/tandem.v1.Drafter/Describe", "open_sequences")
        if a == 0 and b == 0:
            freed = time.time() - t_close
            break
        time.sleep(0.01)
    print("disconnect: sequence freed on verifier and drafter after %s ms" %
          ("%.1f" % (freed * 1e3) if freed is not None else "never"), flush=True)
    check(freed is not None, "the sequence of a client that went away was freed on verifier "
          "and drafter")
    deadline = time.time() + 5
    while time.time() < deadline and "status CANCELLED" not in gw.text():
        time.sleep(0.05)
    check("status CANCELLED" in gw.text(), "the gateway logged the request as cancelled")
    gw_settled(gw)
    check(counter(gw.addr(), "/tandem.v1.Gateway/GetStatus", "generate_cancelled") == cancelled + 1,
          "the gateway counted the cancelled requests")
    # The same for a whole (non-streamed) response: noticed at the next tokens.
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    long_req = json.dumps(dict(body, max_tokens=4000, ignore_eos=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(long_req) + long_req)
    deadline = time.time() + 10
    while time.time() < deadline and \
            counter(v.addr(), "/tandem.v1.Verifier/Describe", "active_sequences") != 1:
        time.sleep(0.01)
    s.close()
    t_close = time.time()
    freed = None
    while time.time() - t_close < 10.0:
        if counter(v.addr(), "/tandem.v1.Verifier/Describe", "active_sequences") == 0 and \
                counter(d.addr(), "/tandem.v1.Drafter/Describe", "open_sequences") == 0:
            freed = time.time() - t_close
            break
        time.sleep(0.01)
    print("disconnect (whole response): sequence freed after %s ms" %
          ("%.1f" % (freed * 1e3) if freed is not None else "never"), flush=True)
    gw_settled(gw)
    check(freed is not None and counter(gw.addr(), "/tandem.v1.Gateway/GetStatus",
                                        "generate_cancelled") == cancelled + 2,
          "a client that went away before its whole response cancelled its sequence")


def case_auth():
    """A gateway with api_tokens_file and no verifier: 401 without the token,
    503 (no verifier) with it, /health open and 503."""
    tokens = os.path.join(st.TMP, "tokens")
    with open(tokens, "w") as f:
        f.write("sesame\n")
    tok = os.path.join(demo("demo-target"), "tokenizer.json")
    gw = st.gateway("--tokenizer", tok, "--http-listen", "127.0.0.1:0", "--http-model-name", MODEL,
                    "--api-tokens-file", tokens)
    port = int(http_port(gw).group(1))
    code, out = get(port, "/health")
    check(code == 503 and json.loads(out)["status"] == "unavailable", "/health without a "
          "verifier: %d %s" % (code, out))
    code, out = get(port, "/v1/models")
    check(code == 401 and json.loads(out)["error"]["type"] == "authentication_error",
          "/v1/models without a token: %d %s" % (code, out))
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
    for auth, want in ((None, 401), ("Bearer wrong", 401), ("Bearer sesame", 503)):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        h = {"Content-Type": "application/json"}
        if auth:
            h["Authorization"] = auth
        c.request("POST", "/v1/completions", json.dumps(body), h)
        r = c.getresponse()
        out = r.read().decode()
        c.close()
        check(r.status == want and "error" in json.loads(out),
              "completion with %s: %d (want %d) %s" % (auth, r.status, want, out))
    # HTTPS with the gateway's tls_cert and tls_key.
    d = os.path.join(st.TMP, "pki")
    os.makedirs(d)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "k.pem",
                    "-out", "c.pem", "-days", "2", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1"], cwd=d, check=True, capture_output=True)
    gw = st.gateway("--tokenizer", tok, "--http-listen", "127.0.0.1:0", "--http-model-name", MODEL,
                    "--tls-cert", os.path.join(d, "c.pem"), "--tls-key", os.path.join(d, "k.pem"))
    m = http_port(gw, "https")
    if check(m is not None, "the gateway serves HTTPS with tls_cert: %s" % gw.text()[-2000:]):
        p = subprocess.run(["curl", "-sS", "--cacert", os.path.join(d, "c.pem"),
                            "https://127.0.0.1:%s/v1/models" % m.group(1)],
                           capture_output=True, text=True, timeout=20)
        check(p.returncode == 0 and json.loads(p.stdout or "{}").get("data", [{}])[0].get("id")
              == MODEL, "/v1/models over HTTPS: %s %s" % (p.stdout, p.stderr))


def npm_openai():
    """The openai package in the build folder (installed once); None when npm
    cannot get it."""
    root = os.path.join(ARGS.work, "openai-sdk")
    if os.path.isdir(os.path.join(root, "node_modules", "openai")):
        return root
    if not shutil.which("npm") or not shutil.which("node"):
        return None
    os.makedirs(root, exist_ok=True)
    try:
        p = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent",
                            "--prefix", root, "openai@4"], capture_output=True, text=True,
                           timeout=180)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0:
        print("npm install openai failed:\n" + p.stderr[-2000:])
        return None
    return root


def case_sdk():
    root = npm_openai()
    if not root:
        print("SKIP: the openai npm package cannot be installed (npm unreachable?); "
              "the SDK case did not run")
        return SKIPPED
    gw, v, d, port = stack()
    n = 20
    ref, ref_done = grpc_text(gw, {"text": PROMPT, "max_tokens": n})
    cref, _ = grpc_text(gw, {"chat": {"messages": chat_messages(), "add_generation_prompt": True},
                             "max_tokens": n, "ignore_eos": True})
    script = os.path.join(root, "sdk_client.mjs")
    shutil.copy(os.path.join(HERE, "sdk_client.mjs"), script)
    p = subprocess.run(["node", script, "http://127.0.0.1:%d/v1" % port, MODEL, PROMPT, str(n)],
                       capture_output=True, text=True, timeout=120)
    if not check(p.returncode == 0, "the SDK client ran: %s" % p.stderr[-3000:]):
        return
    out = json.loads(p.stdout.strip().splitlines()[-1])
    print("SDK client saw: %s" % json.dumps(out)[:1500])
    gen = int(ref_done["stats"]["generated_tokens"])
    c = out["completion"]
    check(c["text"] == ref and c["object"] == "text_completion" and
          c["usage"]["completion_tokens"] == gen and c["tandem"] is not None,
          "SDK completion: %s vs %r" % (c, ref))
    c = out["completion_stream"]
    check(c["text"] == ref and c["usage"] and c["usage"]["completion_tokens"] == gen and
          c["finish"] in ("length", "stop"), "SDK streamed completion: %s vs %r" % (c, ref))
    c = out["chat"]
    check(len(cref) > 0, "gRPC produced chat text")
    check(c["text"] == cref and c["role"] == "assistant" and c["object"] == "chat.completion",
          "SDK chat: %s vs %r" % (c, cref))
    c = out["chat_stream"]
    check(c["text"] == cref and c["role"] == "assistant" and c["finish"] in ("length", "stop"),
          "SDK streamed chat: %s vs %r" % (c, cref))
    check(out["models"] == [MODEL], "SDK models: %s" % out["models"])
    u = out["unknown_model"]
    check(isinstance(u, dict) and u["status"] == 404 and u["code"] == "model_not_found",
          "SDK unknown model: %s" % u)


CASES = {"http": case_http, "sdk": case_sdk, "auth": case_auth}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    for b in ("cli", "gateway", "verifier", "drafter"):
        ap.add_argument("--" + b, required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True, help="folder that caches the npm package")
    ARGS = ap.parse_args()
    st.ARGS = ARGS
    st.TMP = tempfile.mkdtemp(prefix="tandem-openai-")
    t0 = time.time()
    try:
        if CASES[ARGS.case]() == SKIPPED:
            return SKIPPED
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
