#!/usr/bin/python3
"""Render and run: the pods a render of helm/tandem describes, started as
local processes, exactly as rendered -- each container's arguments through
the image's entrypoint (docker/entrypoint.sh), its environment (fieldRefs
resolved as the kubelet would: the pod's IP, its name; $(VAR) expanded), the
files its ConfigMap and Secret volumes mount -- the init containers first
(check-config must pass), then the containers. They must register, pair and
generate: the render's `helm test` pod runs its own command against them.
Probes and metrics ports answer as rendered, and every process exits 0 on
SIGTERM within the pod's terminationGracePeriodSeconds.

The processes run in a network namespace of their own (loopback only, the
pods' IP is 127.0.0.1) with a mount namespace whose /etc/hosts names the
chart's Services, so the rendered ports and Service names are used as they
are. Needs root (unshare); skipped (77) otherwise, or without helm.

usage: render_run.py MODE --source ROOT --tools DIR --bin-dir DIR...
  MODE: remote or colocated (drafter.mode)
"""
import argparse
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import helm_test as ht  # noqa: E402  (tools, template, checks)

check = ht.check


def expand(value, env):
    """Kubernetes' $(VAR) expansion of an env value or argument."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                  value)


class Pod:
    def __init__(self, obj, objs, root):
        self.name = obj["metadata"]["name"] + "-0"
        self.spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
        self.root = os.path.join(root, self.name)
        self.mounts = {}
        cms = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
        secrets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
        self.volumes = {}
        self.empty_dirs = {}
        for v in self.spec.get("volumes", []):
            files = None
            if "emptyDir" in v:
                self.empty_dirs[v["name"]] = v["emptyDir"]
                continue
            if "configMap" in v:
                files = cms[v["configMap"]["name"]].get("data", {})
            elif "secret" in v:
                s = secrets.get(v["secret"]["secretName"])
                if s is not None:
                    files = {k: base64.b64decode(x).decode() for k, x in s["data"].items()}
            self.volumes[v["name"]] = files
        self.procs = []

    def mount(self, c):
        """Writes the container's volumes under the pod's folder; returns the
        path rewriting that stands for the mounts."""
        rewrite = {}
        for m in c.get("volumeMounts", []):
            if m["name"] in self.empty_dirs:
                self.mount_empty_dir(c, m)
                continue
            files = self.volumes.get(m["name"])
            if files is None:
                check(False, "%s/%s: volume %s cannot be provided here" % (self.name, c["name"],
                                                                             m["name"]))
                continue
            d = self.root + m["mountPath"]
            os.makedirs(d, exist_ok=True)
            rewrite[m["mountPath"].rstrip("/") + "/"] = d + "/"
        for m in c.get("volumeMounts", []):
            if m["name"] in self.empty_dirs:
                continue
            files = self.volumes.get(m["name"]) or {}
            d = self.root + m["mountPath"]
            for k, text in files.items():
                for a, b in rewrite.items():
                    text = text.replace(a, b)
                with open(os.path.join(d, k), "w") as f:
                    f.write(text)
        return rewrite

    def mount_empty_dir(self, c, m):
        """The one emptyDir the chart renders: memory-backed, at /dev/shm,
        shared by the verifier and its colocated drafter. It becomes a tmpfs
        of its sizeLimit on /dev/shm in this mount namespace, where both
        processes map what the other offers (shm_open names /dev/shm, so the
        path is not rewritten)."""
        ed = self.empty_dirs[m["name"]]
        if not check(m["mountPath"] == "/dev/shm" and ed.get("medium") == "Memory",
                     "%s/%s: emptyDir %s %s at %s cannot be provided here" %
                     (self.name, c["name"], m["name"], ed, m["mountPath"])):
            return
        if m["name"] in SHM_MOUNTED:
            return
        size = str(ed.get("sizeLimit", "64Mi"))
        mm = re.match(r"^(\d+)([KMG]i)?$", size)
        if not check(mm is not None, "%s: sizeLimit %s" % (m["name"], size)):
            return
        opt = mm.group(1) + {"Ki": "k", "Mi": "m", "Gi": "g", None: ""}[mm.group(2)]
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s,mode=1777" % opt, "tmpfs",
                        "/dev/shm"], check=True)
        SHM_MOUNTED.add(m["name"])
        print("%s: emptyDir %s: a %s tmpfs on /dev/shm" % (self.name, m["name"], size))

    def env(self, c):
        env = {"PATH": os.environ["PATH"], "HOME": self.root}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            else:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"status.podIP": "127.0.0.1", "metadata.name": self.name}[field]
        return env

    def argv(self, c, rewrite, env):
        args = [expand(a, env) for a in c.get("args", [])]
        fixed = []
        for a in args:
            for x, y in rewrite.items():
                if a.startswith(x):
                    a = y + a[len(x):]
            fixed.append(a)
        # The image's ENTRYPOINT, unless the container sets its command.
        if "command" in c:
            return c["command"] + fixed
        return [os.path.join(ARGS.source, "docker", "entrypoint.sh")] + fixed

    def run_init(self):
        for c in self.spec.get("initContainers", []):
            rw = self.mount(c)
            env = self.env(c)
            r = subprocess.run(self.argv(c, rw, env), env=env, capture_output=True, text=True,
                               timeout=60)
            check(r.returncode == 0, "%s: init container %s failed (rc %d):\n%s%s" %
                  (self.name, c["name"], r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
            print("%s: init container %s passed" % (self.name, c["name"]))

    def start(self):
        for c in self.spec["containers"]:
            rw = self.mount(c)
            env = self.env(c)
            log = open(os.path.join(self.root, c["name"] + ".log"), "wb")
            p = subprocess.Popen(self.argv(c, rw, env), env=env, stdout=log, stderr=log)
            self.procs.append((c, p, log))

    def stop(self):
        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        for c, p, log in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for c, p, log in self.procs:
            try:
                rc = p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
                check(False, "%s/%s outlived terminationGracePeriodSeconds %d" %
                      (self.name, c["name"], grace))
            check(rc == 0, "%s/%s exits 0 on SIGTERM (rc %s)" % (self.name, c["name"], rc))
            log.close()

    def logs(self):
        out = ""
        for c, p, log in self.procs:
            with open(os.path.join(self.root, c["name"] + ".log"), "rb") as f:
                out += "---- %s/%s\n%s\n" % (self.name, c["name"],
                                             f.read().decode("utf-8", "replace")[-3000:])
        return out


SHM_MOUNTED = set()


def health(port):
    """grpc.health.v1.Health/Check with an empty request: SERVING is field 1 = 1."""
    import grpc  # Debian's python3-grpcio
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    try:
        call = ch.unary_unary("/grpc.health.v1.Health/Check",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return call(b"", timeout=2) == b"\x08\x01"
    except grpc.RpcError:
        return False
    finally:
        ch.close()


def wait_serving(pods, timeout=60):
    deadline = time.time() + timeout
    want = [(p, c, c["readinessProbe"]["grpc"]["port"]) for p in pods
            for c, _, _ in p.procs if "readinessProbe" in c]
    while time.time() < deadline:
        if all(health(port) for _, _, port in want):
            return True
        for p in pods:
            for c, proc, _ in p.procs:
                if proc.poll() is not None:
                    check(False, "%s/%s exited (rc %s)" % (p.name, c["name"], proc.returncode))
                    return False
        time.sleep(0.2)
    check(False, "readiness probes not SERVING within %ds: %s" %
          (timeout, [(p.name, c["name"], port, health(port)) for p, c, port in want]))
    return False


def inside():
    """In the namespaces: render, start, check."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    src = ARGS.source
    r = ht.template("--set", "drafter.mode=%s,models.target=%s/models/demo-target,"
                    "models.draft=%s/models/demo-drafter,verifier.maxSequences=8,"
                    "drafter.maxSequences=8" % (ARGS.mode, src, src))
    if not check(r.returncode == 0, "helm template: %s" % r.stderr):
        return
    objs = [o for o in yaml.safe_load_all(r.stdout) if o]
    services = [o["metadata"]["name"] for o in objs if o["kind"] == "Service"]
    root = tempfile.mkdtemp(prefix="tandem-render-run-")
    with open(os.path.join(root, "hosts"), "w") as f:
        f.write("127.0.0.1 localhost %s\n" % " ".join(
            n + s for n in services for s in ("", ".ml.svc", ".ml.svc.cluster.local")))
    subprocess.run(["mount", "--bind", os.path.join(root, "hosts"), "/etc/hosts"], check=True)
    deps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    want = ["rel-tandem-gateway", "rel-tandem-verifier"] + (
        ["rel-tandem-drafter"] if ARGS.mode == "remote" else [])
    check(sorted(deps) == sorted(want), "Deployments %s, want %s" % (sorted(deps), want))
    pods = [Pod(deps[n], objs, root) for n in want if n in deps]
    try:
        for p in pods:
            p.run_init()
            p.start()
            if p.name.startswith("rel-tandem-gateway"):
                wait_serving([p])
        if not wait_serving(pods):
            return
        names = [(p.name, [c["name"] for c, _, _ in p.procs]) for p in pods]
        print("serving: %s" % names)
        # Metrics ports as rendered.
        import urllib.request
        for p in pods:
            for c, _, _ in p.procs:
                for port in c.get("ports", []):
                    if port["name"] == "metrics":
                        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" %
                                                    port["containerPort"], timeout=5) as resp:
                            body = resp.read().decode()
                        check('role="%s"' % c["name"] in body, "%s/%s metrics on %d" %
                              (p.name, c["name"], port["containerPort"]))
        # The helm test pod, as rendered.
        test = [o for o in objs if o["kind"] == "Pod"][0]
        tc = test["spec"]["containers"][0]
        env = {"PATH": os.environ["PATH"]}
        r = subprocess.run(tc["command"] + tc["args"], env=env, capture_output=True, text=True,
                           timeout=150)
        check(r.returncode == 0 and "pairs formed (1)" in r.stdout and
              "generated %d" % 8 in r.stderr,
              "the helm test pod's command (rc %d):\n%s\n%s" % (r.returncode, r.stdout[-2000:],
                                                                r.stderr[-2000:]))
        vpod = [p for p in pods if p.name.startswith("rel-tandem-verifier")][0]
        want_c = ["verifier", "drafter"] if ARGS.mode == "colocated" else ["verifier"]
        check([c["name"] for c, _, _ in vpod.procs] == want_c,
              "the verifier pod runs %s" % want_c)
        print(r.stdout[-1200:])
        print(r.stderr[-600:])
        check_exchange(vpod, objs)
    finally:
        for p in reversed(pods):
            p.stop()
        if SHM_MOUNTED:
            left = [f for f in os.listdir("/dev/shm") if f.startswith("tandem-lane-")]
            check(not left, "exchange lanes left in /dev/shm after the pods stopped: %s" % left)
        if ht.FAILURES:
            for p in pods:
                print(p.logs())
            print("work directory kept: %s" % root)
        else:
            shutil.rmtree(root, ignore_errors=True)


def check_exchange(vpod, objs):
    """The Draft stream went the way the chart's exchange_transport says: by
    the shared-memory lane in a colocated pod (both processes say so), by
    gRPC to a remote drafter (no lane offered)."""
    cm = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith(
        "-config")][0]
    want = yaml.safe_load(cm["data"]["verifier.yaml"]).get("exchange_transport")
    logs = {}
    for c, _, _ in vpod.procs:
        with open(os.path.join(vpod.root, c["name"] + ".log"), "rb") as f:
            logs[c["name"]] = f.read().decode("utf-8", "replace")
    if ARGS.mode == "colocated":
        check(want == "shm" and "exchange on shm" in logs.get("verifier", "") and
              "exchange by shared memory" in logs.get("drafter", ""),
              "colocated: exchange_transport %s, the Draft stream on the shared-memory lane" %
              want)
    else:
        check(want == "grpc" and "exchange on shm" not in logs.get("verifier", ""),
              "remote: exchange_transport %s, the Draft stream on gRPC" % want)


ARGS = None


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["remote", "colocated"])
    ap.add_argument("--source", required=True)
    ap.add_argument("--tools", required=True)
    ap.add_argument("--bin-dir", action="append", required=True)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ARGS = ap.parse_args()
    ht.ARGS = argparse.Namespace(source=ARGS.source, tools=ARGS.tools, cli=None)
    ht.CHART = os.path.join(ARGS.source, "helm", "tandem")
    if not ARGS.inside:
        if os.geteuid() != 0:
            ht.skip("render-and-run needs root (a network and mount namespace: unshare)")
        ht.tools()  # skips (77) when helm cannot be had
        cmd = ["unshare", "--net", "--mount", sys.executable] + sys.argv + ["--inside"]
        return subprocess.run(cmd).returncode
    ht.tools()
    os.environ["PATH"] = ":".join(os.path.abspath(d) for d in ARGS.bin_dir) + ":" + \
        os.environ["PATH"]
    t0 = time.time()
    inside()
    print("render-and-run %s: %.1f s, %d failure(s)" % (ARGS.mode, time.time() - t0,
                                                        len(ht.FAILURES)))
    return 1 if ht.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
