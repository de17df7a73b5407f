#!/usr/bin/python3
"""A gRPC client independent of tandem's C code, for interop tests.

Uses Debian's python3-grpcio and python3-protobuf; message classes are
generated at run time from the .proto files with grpc_tools.protoc (nothing
generated is kept in the tree). Calls any unary or server-streaming method by
its full path and prints one JSON object:

    {"code": "OK", "details": "", "responses": [{...}, ...]}

Usage:
    client.py --target HOST:PORT [--source ROOT] [--proto REL.proto ...]
              [--timeout S] [--metadata KEY=VALUE ...] [--stream [--max N]]
              [--ca PEM [--cert PEM --key PEM] [--server-name NAME]]
              /package.Service/Method ['{"json": "request"}']

--source is the repository root (default: two levels above this file); every
.proto under ROOT/proto is compiled, plus each --proto (relative to ROOT).
--stream reads a server stream; --max N cancels it after N messages (the code
is then CANCELLED, reported as such). Exit status: 0 when the call finished
with OK (or was cancelled by --max), 1 otherwise, 2 for usage errors.

As a module: load_messages(), call_unary(), call_stream().
"""
import argparse
import atexit
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import grpc
from google.protobuf import descriptor_pool, json_format, symbol_database

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.dirname(os.path.dirname(HERE))


def _find_protos(root):
    out = []
    for d, _, files in os.walk(os.path.join(root, "proto")):
        for f in sorted(files):
            if f.endswith(".proto"):
                out.append(os.path.relpath(os.path.join(d, f), os.path.join(root, "proto")))
    return sorted(out)


_loaded = {}


def load_messages(source=DEFAULT_SOURCE, extra_protos=(), workdir=None):
    """Generates and imports the _pb2 modules for proto/ and extra_protos.

    proto/ files are compiled with -I ROOT/proto; extra protos (paths relative
    to ROOT, e.g. tests/rpc/echo.proto) with -I ROOT. Idempotent.
    """
    key = (source, tuple(extra_protos))
    if key in _loaded:
        return
    out = workdir
    if out is None:  # generated here, removed when the process ends
        out = tempfile.mkdtemp(prefix="tandem-interop-")
        atexit.register(shutil.rmtree, out, True)
    groups = [(os.path.join(source, "proto"), _find_protos(source))]
    if extra_protos:
        groups.append((source, list(extra_protos)))
    for include, files in groups:
        if not files:
            continue
        cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", include,
               "--python_out=" + out] + files
        r = subprocess.run(cmd, cwd=include, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("protoc failed: %s\n%s" % (" ".join(cmd), r.stderr))
    if out not in sys.path:
        sys.path.append(out)
    # Import dependencies first: modules of proto/ (sorted so that
    # tandem/v1/common comes before the files importing it does not matter:
    # Python imports dependencies on demand).
    for d, _, files in os.walk(out):
        for f in sorted(files):
            if not f.endswith("_pb2.py"):
                continue
            rel = os.path.relpath(os.path.join(d, f), out)[:-3]
            name = rel.replace(os.sep, ".")
            try:
                importlib.import_module(name)
            except ImportError:
                # e.g. grpc/health/v1: the name is taken by the grpc package;
                # such files import no other generated module, so load by path.
                uniq = "tandem_interop_" + name.replace(".", "_")
                spec = importlib.util.spec_from_file_location(uniq, os.path.join(d, f))
                mod = importlib.util.module_from_spec(spec)
                sys.modules[uniq] = mod
                spec.loader.exec_module(mod)
    _loaded[key] = out


def _method(path):
    """'/pkg.Svc/Method' -> (request class, response class, server streaming?)."""
    if not path.startswith("/") or path.count("/") != 2:
        raise ValueError("method must look like /package.Service/Method: %r" % path)
    svc, meth = path[1:].split("/")
    pool = descriptor_pool.Default()
    md = pool.FindServiceByName(svc).methods_by_name[meth]
    db = symbol_database.Default()
    req = db.GetSymbol(md.input_type.full_name)
    resp = db.GetSymbol(md.output_type.full_name)
    return req, resp, md.server_streaming


def channel(target, ca=None, cert=None, key=None, server_name=None):
    if not ca:
        return grpc.insecure_channel(target)

    def read(p):
        with open(p, "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(read(ca), read(key) if key else None,
                                         read(cert) if cert else None)
    opts = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(target, creds, options=opts)


def _status(e):
    return e.code().name, e.details() or ""


def call_unary(ch, path, request=None, timeout=10.0, metadata=()):
    """Returns (code name, details, [response dict])."""
    req_cls, resp_cls, _ = _method(path)
    req = json_format.ParseDict(request or {}, req_cls())
    fn = ch.unary_unary(path, request_serializer=req_cls.SerializeToString,
                        response_deserializer=resp_cls.FromString)
    try:
        resp = fn(req, timeout=timeout, metadata=list(metadata))
    except grpc.RpcError as e:
        code, details = _status(e)
        return code, details, []
    return "OK", "", [json_format.MessageToDict(resp, preserving_proto_field_name=True,
                                                including_default_value_fields=True)]


def call_stream(ch, path, request=None, timeout=10.0, metadata=(), max_messages=None):
    """Reads a server stream; cancels after max_messages when given.

    Returns (code name, details, [response dicts])."""
    req_cls, resp_cls, _ = _method(path)
    req = json_format.ParseDict(request or {}, req_cls())
    fn = ch.unary_stream(path, request_serializer=req_cls.SerializeToString,
                         response_deserializer=resp_cls.FromString)
    it = fn(req, timeout=timeout, metadata=list(metadata))
    out = []
    try:
        for m in it:
            out.append(json_format.MessageToDict(m, preserving_proto_field_name=True,
                                                 including_default_value_fields=True))
            if max_messages is not None and len(out) >= max_messages:
                it.cancel()
                return "CANCELLED", "cancelled by client after %d messages" % len(out), out
    except grpc.RpcError as e:
        code, details = _status(e)
        return code, details, out
    return "OK", "", out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--source", default=DEFAULT_SOURCE)
    ap.add_argument("--proto", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--metadata", action="append", default=[])
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--max", type=int, default=None)
    ap.add_argument("--ca")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--server-name")
    ap.add_argument("method")
    ap.add_argument("request", nargs="?", default="{}")
    a = ap.parse_args(argv)
    try:
        request = json.loads(a.request)
        md = [tuple(kv.split("=", 1)) for kv in a.metadata]
    except ValueError as e:
        print("client.py: bad request JSON or metadata: %s" % e, file=sys.stderr)
        return 2
    load_messages(a.source, a.proto)
    ch = channel(a.target, a.ca, a.cert, a.key, a.server_name)
    if a.stream:
        code, details, resp = call_stream(ch, a.method, request, a.timeout, md, a.max)
    else:
        code, details, resp = call_unary(ch, a.method, request, a.timeout, md)
    ch.close()
    print(json.dumps({"code": code, "details": details, "responses": resp}))
    ok = code == "OK" or (a.max is not None and code == "CANCELLED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
