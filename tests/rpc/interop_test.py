#!/usr/bin/python3
"""Interop: Python's grpcio (an independent gRPC implementation) against the
C layer's rpc_test_server: Health Check/Watch on both ports, the Echo service's
call types, status codes and messages, malformed bytes, and a clean exit on
SIGTERM while a Watch is open.

    interop_test.py --server PATH/rpc_test_server --source REPO_ROOT
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


started = []


def start(server, *args):
    p = subprocess.Popen([server] + list(args), stdout=subprocess.PIPE, text=True)
    started.append(p)
    line = p.stdout.readline()
    if not line.startswith("ready "):
        p.kill()
        raise RuntimeError("server did not start: %r" % line)
    kv = dict(x.split("=") for x in line.split()[1:])
    return p, int(kv["port"]), int(kv["health_port"])


def stop(p, what, sig=signal.SIGTERM):
    p.send_signal(sig)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "timeout"
    check(rc == 0, "%s: exit status after %s is %r, expected 0" % (what, signal.Signals(sig).name, rc))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.source, "tests", "interop"))
    import client

    client.load_messages(a.source, ["tests/rpc/echo.proto"])
    check_path = "/grpc.health.v1.Health/Check"
    watch_path = "/grpc.health.v1.Health/Watch"

    # --- a server that is not ready yet: NOT_SERVING
    p, port, hport = start(a.server, "--not-ready")
    ch = client.channel("127.0.0.1:%d" % port)
    code, _, r = client.call_unary(ch, check_path, {"service": ""})
    check(code == "OK" and r[0]["status"] == "NOT_SERVING", "not ready: Check '' -> %s %r" % (code, r))
    ch.close()
    stop(p, "not-ready server", signal.SIGINT)

    p, port, hport = start(a.server)
    main_t, health_t = "127.0.0.1:%d" % port, "127.0.0.1:%d" % hport
    ch = client.channel(main_t)
    hch = client.channel(health_t)

    # --- Health Check on both ports
    for c, name in ((ch, "main"), (hch, "health")):
        for svc in ("", "tandem.test.Echo"):
            code, _, r = client.call_unary(c, check_path, {"service": svc})
            check(code == "OK" and r and r[0]["status"] == "SERVING",
                  "%s port: Check %r -> %s %r" % (name, svc, code, r))
        code, details, _ = client.call_unary(c, check_path, {"service": "no.such.Svc"})
        check(code == "NOT_FOUND" and "no.such.Svc" in details,
              "%s port: Check unknown -> %s %r" % (name, code, details))

    # --- Watch: current status at once; unknown service -> SERVICE_UNKNOWN
    code, _, r = client.call_stream(ch, watch_path, {"service": ""}, max_messages=1)
    check(code == "CANCELLED" and [m["status"] for m in r] == ["SERVING"], "Watch '' -> %s %r" % (code, r))
    code, _, r = client.call_stream(hch, watch_path, {"service": "nope"}, max_messages=1)
    check([m["status"] for m in r] == ["SERVICE_UNKNOWN"], "Watch unknown -> %s %r" % (code, r))

    # --- Echo: unary with metadata, server streaming, handler errors
    code, _, r = client.call_unary(ch, "/tandem.test.Echo/Say", {"text": "héllo"},
                                   metadata=[("x-test", "from-python")])
    check(code == "OK" and r[0]["text"] == "héllo" and r[0]["metadata"] == "from-python",
          "Say -> %s %r" % (code, r))
    code, _, r = client.call_stream(ch, "/tandem.test.Echo/Repeat", {"text": "t", "count": 5})
    check(code == "OK" and [m["index"] for m in r] == [0, 1, 2, 3, 4], "Repeat -> %s %r" % (code, r))
    code, details, _ = client.call_unary(ch, "/tandem.test.Echo/Say",
                                         {"fail_code": 9, "fail_message": "rule x refused"})
    check(code == "FAILED_PRECONDITION" and details == "rule x refused",
          "Say fail -> %s %r" % (code, details))
    code, details, _ = client.call_unary(ch, "/tandem.test.Echo/Say", {"delay_ms": 2000}, timeout=0.3)
    check(code == "DEADLINE_EXCEEDED", "Say deadline -> %s" % code)

    # --- bidi from Python: messages echoed in order, "end" after half-close
    req_cls, resp_cls, _ = client._method("/tandem.test.Echo/Chat")
    chat = ch.stream_stream("/tandem.test.Echo/Chat", request_serializer=req_cls.SerializeToString,
                            response_deserializer=resp_cls.FromString)
    got = [m.text for m in chat(iter([req_cls(text="a"), req_cls(text="b")]), timeout=10)]
    check(got == ["a", "b", "end"], "Chat -> %r" % got)

    # --- malformed bytes and unknown methods
    for path in ("/tandem.test.Echo/Say", "/tandem.test.Echo/Repeat", check_path, watch_path):
        raw = ch.unary_unary(path)  # no serializer: the bytes go out as they are
        try:
            raw(b"\x0a\x7f\x61", timeout=5)
            check(False, "%s accepted garbage" % path)
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and path in e.details(),
                  "garbage to %s -> %s %r" % (path, e.code(), e.details()))
    code, _, _ = client.call_unary(ch, "/tandem.test.Echo/Say", {"text": "ok"})
    check(code == "OK", "server still serves after garbage: %s" % code)
    try:
        ch.unary_unary("/tandem.test.Echo/Missing")(b"", timeout=5)
        check(False, "unknown method accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNIMPLEMENTED, "unknown method -> %s" % e.code())
    code, _, _ = client.call_unary(hch, "/tandem.test.Echo/Say", {"text": "x"})
    check(code == "UNIMPLEMENTED", "Echo on the health port -> %s" % code)

    # --- server reflection, checked with Python's own descriptor machinery
    from google.protobuf import descriptor_pb2, descriptor_pool as dpool
    for ver in ("v1", "v1alpha"):
        path = "/grpc.reflection.%s.ServerReflection/ServerReflectionInfo" % ver
        rq, rs, _ = client._method(path)
        call = ch.stream_stream(path, request_serializer=rq.SerializeToString,
                                response_deserializer=rs.FromString)
        reqs = [rq(list_services=""),
                rq(file_containing_symbol="grpc.health.v1.Health"),
                rq(file_containing_symbol="tandem.v1.Gateway.GetStatus"),
                rq(file_containing_symbol="grpc.health.v1.HealthCheckResponse.ServingStatus"),
                rq(file_by_filename="tandem/v1/common.proto"),
                rq(file_containing_symbol="no.such.Symbol"),
                rq(all_extension_numbers_of_type="tandem.v1.GetStatusRequest")]
        got = list(call(iter(reqs), timeout=10))
        check(len(got) == len(reqs), "reflection %s: %d responses to %d requests" % (ver, len(got), len(reqs)))
        if len(got) != len(reqs):
            continue
        names = sorted(s.name for s in got[0].list_services_response.service)
        check(names == sorted(["grpc.health.v1.Health", "tandem.test.Echo",
                               "grpc.reflection.v1.ServerReflection",
                               "grpc.reflection.v1alpha.ServerReflection"]),
              "reflection %s list_services -> %r" % (ver, names))

        def files(resp):
            out = []
            for b in resp.file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto()
                fd.ParseFromString(b)
                out.append(fd)
            return out

        h = files(got[1])
        check(h and h[0].name == "grpc/health/v1/health.proto" and
              [m.name for m in h[0].service[0].method] == ["Check", "Watch"],
              "reflection %s Health -> %r" % (ver, [f.name for f in h]))
        g = files(got[2])
        have = {f.name for f in g}
        check(g and g[0].name == "tandem/v1/gateway.proto", "reflection %s GetStatus file -> %r" % (ver, have))
        check(all(d in have for f in g for d in f.dependency),
              "reflection %s: dependencies missing from %r" % (ver, have))
        # The returned files load into a fresh pool, and the method resolves.
        pool = dpool.DescriptorPool()
        pending = list(g)
        for _ in range(len(g) + 1):
            for f in list(pending):
                if all(d not in have or any(d == x.name for x in g if x not in pending) for d in f.dependency):
                    pool.Add(f)
                    pending.remove(f)
        try:
            m = pool.FindMethodByName("tandem.v1.Gateway.GetStatus")
            check(m.input_type.full_name == "tandem.v1.GetStatusRequest",
                  "reflection %s: GetStatus input %s" % (ver, m.input_type.full_name))
        except KeyError as e:
            check(False, "reflection %s: GetStatus not resolvable from returned files: %s" % (ver, e))
        e = files(got[3])
        check(e and e[0].name == "grpc/health/v1/health.proto", "reflection %s nested enum -> %r" % (ver, [f.name for f in e]))
        c = files(got[4])
        check(c and c[0].name == "tandem/v1/common.proto", "reflection %s by filename -> %r" % (ver, [f.name for f in c]))
        check(got[5].error_response.error_code == 5 and "no.such.Symbol" in got[5].error_response.error_message,
              "reflection %s unknown symbol -> %r" % (ver, got[5]))
        check(got[6].all_extension_numbers_response.base_type_name == "tandem.v1.GetStatusRequest",
              "reflection %s extension numbers -> %r" % (ver, got[6]))
        check(got[2].original_request.file_containing_symbol == "tandem.v1.Gateway.GetStatus",
              "reflection %s original_request echoed" % ver)

    # --- the command-line form prints JSON
    r = subprocess.run([sys.executable, os.path.join(a.source, "tests", "interop", "client.py"),
                        "--target", health_t, "--source", a.source, check_path, '{"service": ""}'],
                       capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout) if r.stdout.strip() else {}
    check(r.returncode == 0 and out.get("responses", [{}])[0].get("status") == "SERVING",
          "client.py CLI -> rc %d %r %s" % (r.returncode, r.stdout, r.stderr[-500:]))

    # --- SIGTERM with a Watch open: it sees NOT_SERVING, the stream ends,
    # the process exits 0
    seen = []

    def watcher():
        seen.append(client.call_stream(hch, watch_path, {"service": ""}, timeout=30))

    t = threading.Thread(target=watcher)
    t.start()
    time.sleep(0.3)
    t0 = time.time()
    stop(p, "server")
    t.join(timeout=30)
    dt = time.time() - t0
    check(dt < 10, "shutdown took %.1f s" % dt)
    check(seen and [m["status"] for m in seen[0][2]][-1:] == ["NOT_SERVING"],
          "Watch during shutdown -> %r" % (seen,))
    ch.close()
    hch.close()

    if failures:
        print("%d interop check(s) failed" % len(failures), file=sys.stderr)
        return 1
    print("interop: all checks passed")
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        for proc in started:  # never leave a server behind, whatever failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    sys.exit(rc)
