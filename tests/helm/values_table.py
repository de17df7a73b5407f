#!/usr/bin/python3
"""The values table of helm/tandem/README.md, generated from values.yaml:
one row per key with its default and its `# --` comment (or, for the keys
every role repeats, the sentence below). The chart test fails when the
README's table differs from this output.

usage: values_table.py helm/tandem/values.yaml > table.md
"""
import json
import re
import sys

import yaml

# Keys whose meaning is the same wherever they appear (by their last parts).
SHARED = {
    "pullPolicy": "Always, IfNotPresent or Never.",
    "replicas": "Pods of the role (when its autoscaler is off).",
    "resources": "Resource requests and limits of the role's container (GPUs: `gpus`).",
    "nodeSelector": "Node labels the role's pods need.",
    "tolerations": "Taints the role's pods tolerate.",
    "affinity": "Affinity of the role's pods (replaces antiAffinity).",
    "podAnnotations": "Extra annotations of the role's pods.",
    "backend": "auto, cpu or cuda (backend).",
    "gpus": "NVIDIA GPUs per pod (nvidia.com/gpu).",
    "antiAffinity": "none, soft or hard: spread the role's pods over nodes.",
    "checkConfig": "Run --check-config on the rendered config before the service starts.",
    "startupProbe.periodSeconds": "Seconds between startup probes.",
    "startupProbe.failureThreshold": "Failed startup probes before the pod restarts.",
    "pdb.enabled": "A PodDisruptionBudget for the role.",
    "pdb.minAvailable": "Pods that must stay up through voluntary disruptions.",
    "pdb.maxUnavailable": "Pods that may be down at once through voluntary disruptions.",
    "autoscaling.enabled": "Scale the role on its metrics (autoscaling.provider).",
    "autoscaling.minReplicas": "Fewest pods.",
    "autoscaling.maxReplicas": "Most pods.",
    "autoscaling.metrics": "Per-pod metrics and their target averages.",
    "autoscaling.cpuUtilization": "Also scale on CPU utilization (percent); 0: not.",
    "autoscaling.memoryUtilization": "Also scale on memory utilization (percent); 0: not.",
    "secrets.gateway": "Secret of the gateway's certificate.",
    "secrets.verifier": "Secret of the verifiers' certificate.",
    "secrets.drafter": "Secret of the drafters' certificate.",
    "issuerRef.name": "The Issuer or ClusterIssuer that signs the roles' certificates.",
    "issuerRef.kind": "Issuer or ClusterIssuer.",
    "certManager.duration": "Lifetime of the certificates.",
    "certManager.renewBefore": "Renew this long before they expire.",
    "service.port": "Port of the gateway's Service (the public API, and the registry).",
    "keda.pollingInterval": "Seconds between KEDA's queries.",
    "serviceMonitor.interval": "Scrape interval.",
}


def comments(path):
    """`# --` comments (with their continuation lines), by key path."""
    out, stack, pending = {}, [], []
    for ln in open(path).read().splitlines():
        m = re.match(r"^\s*# -- (.*)$", ln)
        if m:
            pending = [m.group(1)]
            continue
        m = re.match(r"^\s*# (.*)$", ln)
        if m and pending:
            pending.append(m.group(1))
            continue
        m = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):", ln)
        if m:
            stack = stack[:len(m.group(1)) // 2] + [m.group(2)]
            if pending:
                out[".".join(stack)] = " ".join(pending)
        pending = []
    return out


def leaves(d, prefix=""):
    for k, v in d.items():
        p = prefix + k
        if isinstance(v, dict) and v:
            yield from leaves(v, p + ".")
        else:
            yield p, v


def table(path):
    values = yaml.safe_load(open(path))
    doc = comments(path)
    rows = ["| key | default | what |", "|---|---|---|"]
    for k, v in leaves(values):
        d = doc.get(k)
        if not d:
            parts = k.split(".")
            d = next((SHARED[".".join(parts[-n:])] for n in (2, 1)
                      if ".".join(parts[-n:]) in SHARED), "")
        rows.append("| `%s` | `%s` | %s |" % (k, json.dumps(v), d.replace("|", "\\|")))
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(sys.argv[1]))
