// Validates every object of a rendered chart (multi-document YAML) against
// the Kubernetes API schemas of the kubernetes-models packages (core kinds,
// and the CRDs the chart may render: ServiceMonitor, ScaledObject,
// Certificate). Prints one JSON line per object ({kind, name, ...}) for the
// test to check; exits 1 naming every invalid object and why.
//   node validate.mjs RENDERED.yaml   (NODE_PATH: where the packages are)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";

const nodePath = process.env.NODE_MODULES;
const load = (spec) => import(pathToFileURL(path.join(nodePath, spec)).href);
const { parseAllDocuments } = await import(pathToFileURL(
  createRequire(path.join(nodePath, "x.js")).resolve("yaml")).href);

// apiVersion -> [package, subpath]
const groups = {
  "v1": ["kubernetes-models", "v1"],
  "apps/v1": ["kubernetes-models", "apps/v1"],
  "policy/v1": ["kubernetes-models", "policy/v1"],
  "autoscaling/v2": ["kubernetes-models", "autoscaling/v2"],
  "networking.k8s.io/v1": ["kubernetes-models", "networking.k8s.io/v1"],
  "monitoring.coreos.com/v1": ["@kubernetes-models/prometheus-operator", "monitoring.coreos.com/v1"],
  "keda.sh/v1alpha1": ["@kubernetes-models/keda", "keda.sh/v1alpha1"],
  "cert-manager.io/v1": ["@kubernetes-models/cert-manager", "cert-manager.io/v1"],
};

async function modelOf(apiVersion, kind) {
  const g = groups[apiVersion];
  if (!g) return null;
  // Packages export their groups as ESM subpaths: resolve the file itself.
  const file = path.join(g[0], g[1], kind + ".js");
  try {
    return (await load(file))[kind];
  } catch {
    return null;
  }
}

const text = readFileSync(process.argv[2], "utf8");
let bad = 0;
for (const doc of parseAllDocuments(text)) {
  if (doc.errors.length) {
    console.error("YAML error: " + doc.errors.map((e) => e.message).join("; "));
    bad++;
    continue;
  }
  const obj = doc.toJS();
  if (!obj) continue;
  const id = `${obj.kind}/${obj.metadata && obj.metadata.name} (${obj.apiVersion})`;
  const Model = await modelOf(obj.apiVersion, obj.kind);
  if (!Model) {
    console.error(`${id}: no schema for this apiVersion and kind`);
    bad++;
    continue;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    console.error(`${id}: ${e.message}`);
    bad++;
    continue;
  }
  const spec = obj.kind === "Pod" ? obj.spec : obj.spec && obj.spec.template && obj.spec.template.spec;
  const out = { kind: obj.kind, name: obj.metadata.name };
  if (spec) {
    out.containers = (spec.containers || []).map((c) => c.name);
    out.initContainers = (spec.initContainers || []).map((c) => c.name);
  }
  console.log(JSON.stringify(out));
}
if (bad) {
  console.error(`${bad} invalid object(s)`);
  process.exit(1);
}
