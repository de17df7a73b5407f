#!/usr/bin/python3
"""Tests of `tandem doctor` (DESIGN.md section 6) on real files and processes:

  gpu       without an NVIDIA driver, a clear finding; the exit status says
            whether the configuration needs a GPU (backend cuda) or not
  fake_driver
            a stand-in libcuda.so.1 (fake_cuda.c) found through
            LD_LIBRARY_PATH: its device, compute capability and driver
            version reported and checked against the build; cuInit failing
  models    the demo target model, healthy (one file and sharded), then
            corrupted copies: a shard deleted, a truncated file, a header
            with a wrong shape, a broken config.json, bytes appended; each
            named in a finding, with a non-zero exit status
  replicas  a gateway with replicas registered from Python whose build and
            protocol differ from this build: doctor names the rule that
            refuses them

Corruptions are made here with Python's own safetensors writer (struct +
json), independent of the C reader.

usage: doctor_test.py CASE --cli PATH --gateway PATH --fake-driver DIR --source ROOT
"""
import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "services"))
import services_test as st  # noqa: E402

ARGS = None
TMP = None
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what, flush=True)
    return cond


def clean_env(extra=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    e.update(extra or {})
    return e


def doctor(*args, env=None):
    """Runs `tandem doctor --json ARGS`; returns (rc, findings, text)."""
    r = subprocess.run([ARGS.cli, "doctor", "--json"] + list(args), capture_output=True,
                       text=True, env=clean_env(env), timeout=120)
    try:
        j = json.loads(r.stdout)
    except ValueError:
        check(False, "doctor --json printed no JSON (rc %d):\n%s\n%s" % (r.returncode, r.stdout,
                                                                        r.stderr))
        return r.returncode, [], r.stdout + r.stderr
    check(j["safe_to_start"] == (r.returncode == 0), "safe_to_start agrees with the exit status")
    check(j["errors"] == sum(f["severity"] == "error" for f in j["findings"]), "error count")
    for f in j["findings"]:
        check(f["severity"] in ("ok", "warning", "error"), "severity %s" % f)
        check(f["severity"] == "ok" or f["fix"], "a finding that is not ok has a fix: %s" % f)
    return r.returncode, j["findings"], r.stdout


def errors(findings, check_name=None):
    return [f for f in findings if f["severity"] == "error" and
            (check_name is None or f["check"] == check_name)]


def write(name, text):
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        f.write(text)
    return p


# ---- safetensors, written here -------------------------------------------------

def st_read(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    return header, b[8 + n:]


def st_write(path, header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def demo_copy(name):
    d = os.path.join(TMP, name)
    shutil.copytree(os.path.join(ARGS.source, "models", "demo-target"), d)
    return d


def shard(d, parts=2):
    """Splits d/model.safetensors into `parts` shards with an index.json."""
    header, data = st_read(os.path.join(d, "model.safetensors"))
    meta = header.pop("__metadata__", None)
    names = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    weight_map = {}
    per = (len(names) + parts - 1) // parts
    files = []
    for i in range(parts):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, parts)
        h, chunk = {}, b""
        for n in names[i * per:(i + 1) * per]:
            b, e = header[n]["data_offsets"]
            h[n] = dict(header[n], data_offsets=[len(chunk), len(chunk) + e - b])
            chunk += data[b:e]
            weight_map[n] = fname
        if meta:
            h["__metadata__"] = meta
        st_write(os.path.join(d, fname), h, chunk)
        files.append(fname)
    os.remove(os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, f)
    return files


# ---- cases ----------------------------------------------------------------------

def driver_present():
    rc, findings, _ = doctor()
    return any(f["check"] == "driver" and f["severity"] == "ok" for f in findings)


def case_gpu():
    if driver_present():
        print("skipped: this machine has an NVIDIA driver")
        sys.exit(77)
    model = os.path.join(ARGS.source, "models", "demo-target")
    rc, findings, text = doctor()
    gpu = [f for f in findings if f["check"] == "gpu"]
    check(len(gpu) == 1 and "no NVIDIA driver found" in gpu[0]["message"] and
          "libcuda.so.1" in gpu[0]["message"] and "cpu backend will be used" in gpu[0]["message"],
          "a clear finding without a driver: %s" % gpu)
    check(rc == 0, "nothing asks for a GPU: exit 0, got %d\n%s" % (rc, text))
    # A configuration on the cpu backend (or auto) starts without a GPU.
    for backend in ("cpu", "auto"):
        cfg = write("v-%s.yaml" % backend, "model: %s\nbackend: %s\n" % (model, backend))
        rc, findings, text = doctor("--config", cfg, "--role", "verifier")
        check(rc == 0, "backend %s without a GPU: exit 0, got %d\n%s" % (backend, rc, text))
        check(any(f["check"] == "config" and f["severity"] == "ok" and "valid" in f["message"]
                  for f in findings), "the configuration is valid:\n" + text)
    # One that asks for cuda does not.
    cfg = write("v-cuda.yaml", "model: %s\nbackend: cuda\n" % model)
    rc, findings, text = doctor("--config", cfg, "--role", "verifier")
    check(rc == 1, "backend cuda without a GPU: exit 1, got %d\n%s" % (rc, text))
    gpu = errors(findings, "gpu")
    check(len(gpu) == 1 and "no NVIDIA driver found" in gpu[0]["message"] and
          "asks for backend cuda" in gpu[0]["message"] and "backend: cpu" in gpu[0]["fix"],
          "the GPU finding is an error naming backend cuda: %s" % gpu)
    # The same checks as --check-config: its error names the setting and its source.
    check(any("backend=cuda (file:%s:2)" % cfg in f["message"] for f in errors(findings, "config")),
          "the configuration's error as --check-config words it:\n" + text)
    # The environment is read as the service reads it.
    rc, findings, text = doctor("--config", write("v-env.yaml", "model: %s\n" % model),
                                "--role", "verifier", env={"TANDEM_BACKEND": "cuda"})
    check(rc == 1 and errors(findings, "gpu"), "TANDEM_BACKEND=cuda needs a GPU too:\n" + text)
    # Readable output: severity first, fixes under the finding.
    r = subprocess.run([ARGS.cli, "doctor", "--config", cfg, "--role", "verifier"],
                       capture_output=True, text=True, env=clean_env(), timeout=60)
    check(r.returncode == 1 and re.search(r"^error +gpu +no NVIDIA driver found", r.stdout, re.M)
          and re.search(r"^ +fix: ", r.stdout, re.M) and "not safe to start" in r.stdout,
          "text output:\n" + r.stdout)
    # Usage errors are 2.
    r = subprocess.run([ARGS.cli, "doctor", "--config", cfg], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    check(r.returncode == 2 and "--role" in r.stderr, "--config without --role: %s" % r.stderr)


def fake(**env):
    e = {"LD_LIBRARY_PATH": ARGS.fake_driver + ":" + os.environ.get("LD_LIBRARY_PATH", "")}
    e.update({"FAKE_CUDA_" + k.upper(): str(v) for k, v in env.items()})
    return e


def build_info():
    r = subprocess.run([ARGS.cli, "doctor", "--json"], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    return json.loads(r.stdout)["build"]


def case_fake_driver():
    build = build_info()
    model = os.path.join(ARGS.source, "models", "demo-target")
    rc, findings, text = doctor(env=fake())
    check(any(f["check"] == "driver" and f["severity"] == "ok" and
              "NVIDIA driver supports CUDA 12.8, 1 device(s)" in f["message"] for f in findings),
          "the driver's CUDA version and device count:\n" + text)
    gpu = [f for f in findings if f["check"] == "gpu"]
    check(len(gpu) == 1 and "GPU 0: Fake GPU 0, compute capability 9.0, 80.0 GiB" in
          gpu[0]["message"], "the device's name, capability and memory: %s" % gpu)
    if not build["cuda_runtime"]:
        check(gpu and gpu[0]["severity"] == "warning" and "no CUDA backend" in gpu[0]["message"],
              "a cpu-only build says the GPU stays unused: %s" % gpu)
    elif "sm_90" in build["gpu_archs"].split(","):
        check(gpu and gpu[0]["severity"] == "ok" and "native code" in gpu[0]["message"],
              "sm_90 runs natively on 9.0: %s" % gpu)
    # cuBLAS, which a CUDA build opens for a prompt's prefill: with a GPU
    # here, found is said with its use, missing is a warning.
    cb = [f for f in findings if f["check"] == "cublas"]
    if build["cuda_runtime"]:
        check(len(cb) == 1 and (
            (cb[0]["severity"] == "ok" and "prefill on CUDA runs" in cb[0]["message"]) or
            (cb[0]["severity"] == "warning" and "keeps the exact matmuls" in cb[0]["message"])),
            "cuBLAS on a CUDA build with a GPU: %s" % cb)
    else:
        check(len(cb) == 1 and cb[0]["severity"] == "ok" and
              "does not use it" in cb[0]["message"], "cuBLAS on a CPU-only build: %s" % cb)
    # A cuBLAS of another major found first: a CUDA build, which opens its
    # own major's, warns; a CPU-only build does not use it.
    e = fake()
    e["LD_LIBRARY_PATH"] = ARGS.fake_cublas + ":" + e["LD_LIBRARY_PATH"]
    rc, findings, text = doctor(env=e)
    cb = [f for f in findings if f["check"] == "cublas"]
    major = build["cuda_runtime"].split(".")[0]
    if build["cuda_runtime"] and major != "12":
        check(len(cb) == 1 and cb[0]["severity"] == "warning" and
              "cuBLAS 12.4.0 found" in cb[0]["message"] and
              "opens libcublas.so.%s" % major in cb[0]["message"],
              "cuBLAS 12 beside a CUDA %s build: %s" % (major, cb))
    elif not build["cuda_runtime"]:
        check(len(cb) == 1 and cb[0]["severity"] == "ok" and "cuBLAS 12.4.0" in cb[0]["message"],
              "cuBLAS 12 beside a CPU-only build: %s" % cb)
    # cuInit failing: named with the driver's words; an error only for backend cuda.
    rc, findings, text = doctor(env=fake(init=100))
    gpu = [f for f in findings if f["check"] == "gpu"]
    check(rc == 0 and len(gpu) == 1 and
          "cuInit failed with CUDA error 100 (no CUDA-capable device is detected)" in
          gpu[0]["message"] and gpu[0]["severity"] != "error",
          "cuInit failing without a configuration: %s" % gpu)
    cfg = write("v-cuda.yaml", "model: %s\nbackend: cuda\n" % model)
    rc, findings, text = doctor("--config", cfg, "--role", "verifier", env=fake(init=100))
    check(rc == 1 and any("cuInit failed" in f["message"] for f in errors(findings, "gpu")),
          "cuInit failing with backend cuda is an error:\n" + text)
    rc, findings, text = doctor(env=fake(devices=0))
    check(any("shows no device" in f["message"] for f in findings if f["check"] == "gpu"),
          "no device:\n" + text)
    # Whether work on the device goes through an MPS server, where the
    # driver says (CU_DEVICE_ATTRIBUTE_MPS_ENABLED), and nothing where not.
    for mps, says in (("1", "work goes through an MPS server"),
                      ("0", "no MPS server (processes on it take turns)"), (None, None)):
        rc, findings, text = doctor(env=fake(mps=mps) if mps else fake())
        gpu = [f for f in findings if f["check"] == "gpu"]
        check(len(gpu) == 1 and (says in gpu[0]["message"] if says else
                                 "MPS" not in gpu[0]["message"]),
              "MPS %s: %s" % (mps, gpu))
    # tensor_parallel on cuda needs a GPU a rank
    tp = write("v-tp.yaml", "model: %s\nbackend: cuda\ntensor_parallel: 2\n" % model)
    rc, findings, text = doctor("--config", tp, "--role", "verifier", env=fake())
    check(rc == 1 and any("tensor_parallel 2 splits the model over CUDA devices 0..1, one a "
                          "rank; 1 visible" in f["message"] for f in errors(findings, "gpu")),
          "tensor_parallel 2 on one GPU:\n" + text)
    rc, findings, text = doctor("--config", tp, "--role", "verifier", env=fake(devices=2))
    check(not any("tensor_parallel" in f["message"] for f in errors(findings, "gpu")),
          "tensor_parallel 2 on two GPUs:\n" + text)
    if not build["cuda_runtime"]:
        return
    # A CUDA build: capability and driver version against what it carries.
    archs = build["gpu_archs"]
    rc, findings, text = doctor("--config", cfg, "--role", "verifier", env=fake(cc="3.5"))
    check(rc == 1 and any("cannot run on compute capability 3.5" in f["message"] and
                          "CMAKE_CUDA_ARCHITECTURES=35" in f["fix"]
                          for f in errors(findings, "gpu")),
          "compute capability 3.5 against %s:\n%s" % (archs, text))
    major = int(build["cuda_runtime"].split(".")[0])
    rc, findings, text = doctor(env=fake(driver=(major - 1) * 1000))
    check(rc == 1 and any("older major version cannot run it" in f["message"]
                          for f in errors(findings, "driver")),
          "a driver of CUDA %d against a build of CUDA %s:\n%s" % (major - 1,
                                                                  build["cuda_runtime"], text))


def model_findings(d):
    rc, findings, text = doctor("--model", d)
    return rc, [f for f in findings if f["check"] == "model"], text


def case_models():
    healthy = os.path.join(ARGS.source, "models", "demo-target")
    rc, fs, text = model_findings(healthy)
    check(rc == 0 and fs and all(f["severity"] == "ok" for f in fs),
          "the demo target model is healthy:\n" + text)
    check(any("every tensor config.json implies is present" in f["message"] for f in fs),
          "shapes checked:\n" + text)
    sharded = demo_copy("sharded")
    shard(sharded)
    rc, fs, text = model_findings(sharded)
    check(rc == 0 and all(f["severity"] == "ok" for f in fs) and
          any("in 2 file(s)" in f["message"] for f in fs), "a sharded copy is healthy:\n" + text)

    # A shard deleted.
    d = demo_copy("missing-shard")
    files = shard(d)
    os.remove(os.path.join(d, files[1]))
    rc, fs, text = model_findings(d)
    e = [f for f in fs if f["severity"] == "error"]
    check(rc == 1 and any(files[1] in f["message"] and "cannot open" in f["message"] for f in e),
          "a deleted shard is named:\n" + text)

    # A truncated file.
    d = demo_copy("truncated")
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 4096)
    rc, fs, text = model_findings(d)
    e = [f for f in fs if f["severity"] == "error"]
    check(rc == 1 and any(p in f["message"] and "truncated" in f["message"] for f in e),
          "a truncated file is named:\n" + text)

    # A header whose shape disagrees with config.json (same byte count).
    d = demo_copy("wrong-shape")
    p = os.path.join(d, "model.safetensors")
    header, data = st_read(p)
    name = "model.norm.weight"
    hidden = header[name]["shape"][0]
    header[name]["shape"] = [hidden // 2, 2]
    st_write(p, header, data)
    rc, fs, text = model_findings(d)
    e = [f for f in fs if f["severity"] == "error"]
    want = "tensor '%s' has shape [%d, 2], but config.json implies [%d]" % (name, hidden // 2,
                                                                           hidden)
    check(rc == 1 and any(want in f["message"] for f in e),
          "a wrong shape is named (%r):\n%s" % (want, text))

    # A broken config.json.
    d = demo_copy("broken-config")
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model_type": "qwen3_5_text", "hidden_size": ')
    rc, fs, text = model_findings(d)
    e = [f for f in fs if f["severity"] == "error"]
    check(rc == 1 and any("config.json" in f["message"] for f in e),
          "a broken config.json is named:\n" + text)

    # Bytes appended: the file's length and its header disagree.
    d = demo_copy("appended")
    p = os.path.join(d, "model.safetensors")
    with open(p, "ab") as f:
        f.write(b"\0" * 1000)
    rc, fs, text = model_findings(d)
    w = [f for f in fs if f["severity"] == "warning"]
    check(any(p in f["message"] and "1000 bytes" in f["message"] for f in w),
          "appended bytes are named:\n" + text)

    # The configuration's model is checked too, and its failure named there.
    d = demo_copy("config-model")
    os.remove(os.path.join(d, "model.safetensors"))
    cfg = write("v.yaml", "model: %s\nbackend: cpu\n" % d)
    rc, findings, text = doctor("--config", cfg, "--role", "verifier")
    check(rc == 1 and any(f["check"] == "model" and d in f["message"]
                          for f in errors(findings)), "the configuration's model:\n" + text)


# ---- a gateway and replicas from Python -------------------------------------------

def register(gw, descriptor):
    code, details, _ = st.unary(gw.addr(), "/tandem.v1.Registry/RegisterReplica",
                                {"descriptor": descriptor})
    check(code == "OK", "registration of %s: %s %s" % (descriptor["replica_id"], code, details))


def case_replicas():
    build = build_info()
    gw = st.gateway("--replica-ttl", "60s")

    def desc(rid, role, **kw):
        d = {"role": role, "replica_id": rid, "address": "10.9.9.9:1",
             "protocol": {"major": 1, "minor": 1}, "snapshot_layout_version": 1,
             "state_strategy": "STATE_STRATEGY_EXTRA_BUFFER", "instance_id": "i-" + rid,
             "tokenizer_fingerprint": "ab" * 32, "model_fingerprint": "cd" * 32,
             "model_name": "demo", "build": {"version": build["version"],
                                             "git_revision": build["git_revision"]}}
        d.update(kw)
        return d

    # One replica of this build, and two from other builds.
    register(gw, desc("v-same", "ROLE_VERIFIER", max_draft_tokens=8))
    register(gw, desc("d-proto", "ROLE_DRAFTER", draft_block_size=4,
                         drafter_kind="DRAFTER_KIND_MODEL", protocol={"major": 2, "minor": 0},
                         build={"version": "2.0.0", "git_revision": "feedface"}))
    register(gw, desc("v-layout", "ROLE_VERIFIER", max_draft_tokens=8,
                         snapshot_layout_version=2,
                         build={"version": "0.0.9", "git_revision": "0ldbu1ld"}))

    rc, findings, text = doctor("--gateway", gw.addr())
    check(rc == 1, "mismatched replicas: exit 1, got %d\n%s" % (rc, text))
    msgs = [f["message"] for f in findings]
    check(any(f["check"] == "gateway" and f["severity"] == "ok" and "3 replica(s)" in f["message"]
              for f in findings), "the gateway is reached:\n" + text)
    proto = [f for f in errors(findings, "replica") if "d-proto (10.9.9.9:1)" in f["message"]]
    check(len(proto) == 1 and proto[0]["message"].startswith("rule protocol-major:") and
          "protocol " + st.build_protocol() in proto[0]["message"] and
          "protocol 2.0" in proto[0]["message"],
          "d-proto refused against this build by protocol-major: %s" % proto)
    layout = [f for f in errors(findings, "replica") if "v-layout (10.9.9.9:1)" in f["message"]]
    check(len(layout) == 1 and layout[0]["message"].startswith("rule snapshot-layout:"),
          "v-layout refused against this build by snapshot-layout: %s" % layout)
    check(any("runs tandem 2.0.0 (revision feedface" in m for m in msgs) and
          any("runs tandem 0.0.9 (revision 0ldbu1ld" in m for m in msgs),
          "other builds are named:\n" + text)
    check(any(f["severity"] == "ok" and "v-same (10.9.9.9:1)" in f["message"] and
              "compatible with this build" in f["message"] for f in findings),
          "the replica of this build is ok:\n" + text)
    # What the gateway itself refuses, with its rule.
    check(any(f["check"] == "gateway" and f["severity"] == "error" and
              "verifier v-same + drafter d-proto" in f["message"] and
              "rule protocol-major:" in f["message"] for f in findings),
          "the gateway's refusal is reported:\n" + text)

    # With a drafter's configuration: the pair rules as the gateway would apply them.
    model = os.path.join(ARGS.source, "models", "demo-drafter")
    cfg = write("d.yaml", "model: %s\nbackend: cpu\ndraft_block_size: 12\nreplica_id: d-new\n"
                % model)
    rc, findings, text = doctor("--gateway", gw.addr(), "--config", cfg, "--role", "drafter")
    block = [f for f in errors(findings, "replica") if "rule draft-block-size:" in f["message"]]
    check(rc == 1 and len(block) == 2 and "max_draft_tokens" in block[0]["fix"],
          "draft-block-size against both verifiers: %s\n%s" % (block, text))
    tok = [f for f in errors(findings, "replica") if "rule tokenizer-fingerprint:" in f["message"]]
    check(len(tok) == 2, "tokenizer-fingerprint against both verifiers:\n" + text)

    # Pairs on one GPU: through MPS, or as two contexts that take turns.
    gw2 = st.gateway("--replica-ttl", "60s")
    gx, gy = "GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"
    register(gw2, desc("v-x", "ROLE_VERIFIER", max_draft_tokens=8, device_uuid=gx))
    register(gw2, desc("d-x", "ROLE_DRAFTER", draft_block_size=4, drafter_kind="DRAFTER_KIND_MODEL",
                       device_uuid=gx, device_mps=True))
    register(gw2, desc("v-y", "ROLE_VERIFIER", max_draft_tokens=8, device_uuid=gy,
                       device_mps=True))
    register(gw2, desc("d-y", "ROLE_DRAFTER", draft_block_size=4, drafter_kind="DRAFTER_KIND_MODEL",
                       device_uuid=gy, device_mps=True))
    rc, findings, text = doctor("--gateway", gw2.addr())
    turns = [f for f in findings if f["check"] == "gateway" and "two contexts" in f["message"]]
    check(len(turns) == 1 and turns[0]["severity"] == "warning" and
          "verifier v-x + drafter d-x share GPU %s" % gx in turns[0]["message"] and
          "the verifier not through an MPS server" in turns[0]["message"] and
          "nvidia-cuda-mps-control -d" in turns[0]["fix"],
          "v-x + d-x take turns on one GPU: %s\n%s" % (turns, text))
    mps = [f for f in findings if "both through an MPS server" in f["message"]]
    check(len(mps) == 1 and mps[0]["severity"] == "ok" and "v-y + drafter d-y" in mps[0]["message"],
          "v-y + d-y share through MPS: %s\n%s" % (mps, text))
    check(rc == 0, "GPU sharing is a warning, not an error: rc %d\n%s" % (rc, text))
    r = subprocess.run([ARGS.cli, "status", "--gateway", gw2.addr()], capture_output=True,
                       text=True, env=clean_env(), timeout=60)
    check(r.returncode == 0 and "GPU %s, through an MPS server" % gy in r.stdout and
          "on one GPU (%s) as two contexts, which take turns on it (the verifier not" % gx
          in r.stdout and "on one GPU (%s), both through an MPS server" % gy in r.stdout,
          "tandem status shows the GPUs and how pairs share them:\n" + r.stdout + r.stderr)

    # A gateway that is not there.
    rc, findings, text = doctor("--gateway", "127.0.0.1:1", "--timeout", "1s")
    check(rc == 1 and any(f["check"] == "gateway" and "UNAVAILABLE" in f["message"]
                          for f in errors(findings)), "no gateway:\n" + text)


CASES = {"gpu": case_gpu, "fake_driver": case_fake_driver, "models": case_models,
         "replicas": case_replicas}


def main():
    global ARGS, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--cli", required=True)
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--fake-driver", required=True, help="folder of the stand-in libcuda.so.1")
    ap.add_argument("--fake-cublas", required=True,
                    help="folder of a stand-in libcublas.so of major 12")
    ap.add_argument("--source", required=True)
    ARGS = ap.parse_args()
    TMP = tempfile.mkdtemp(prefix="tandem-doctor-")
    # processes and gRPC calls through the services tests' helpers
    st.ARGS = types.SimpleNamespace(cli=ARGS.cli, gateway=ARGS.gateway, verifier=None,
                                    drafter=None, source=ARGS.source)
    st.TMP = TMP
    try:
        CASES[ARGS.case]()
    finally:
        for p in st.PROCS:
            p.stop(signal.SIGTERM)
        if FAILURES or st.FAILURES:
            for p in st.PROCS:
                print("---- log of %s\n%s" % (p.name, p.text()[-4000:]))
        shutil.rmtree(TMP, ignore_errors=True)
    if FAILURES or st.FAILURES:
        print("%d check(s) failed" % (len(FAILURES) + len(st.FAILURES)))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
