#!/usr/bin/python3
"""What the Dockerfiles promise, read from them (no Docker daemon runs here;
image_rootfs builds and runs the CPU image itself): two stages each, the
runtime stage on the base the issue names (Debian 12 slim; the CUDA 13.0
runtime image) with a devel/slim build stage, the runtime libraries from
docker/runtime-deps.sh rather than a list, user 10001, the one entrypoint,
the demo models, and every file a COPY names present in the tree (and not
left out by .dockerignore).

usage: dockerfiles_test.py SOURCE_DIR
"""
import fnmatch
import os
import re
import sys

SRC = sys.argv[1]
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what)


def instructions(path):
    text = open(path).read().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


ignored = [l.strip() for l in open(os.path.join(SRC, ".dockerignore"))
           if l.strip() and not l.startswith("#")]
for name, base in (("Dockerfile", r"debian:\$\{DEBIAN\}-slim"),
                   ("Dockerfile.cuda", r"nvidia/cuda:\$\{CUDA\}-runtime-\$\{UBUNTU\}")):
    ins = instructions(os.path.join(SRC, "docker", name))
    args = dict(re.match(r"(\w+)=?(.*)", a).groups() for w, a in ins if w == "ARG")
    froms = [a for w, a in ins if w == "FROM"]
    check(len(froms) == 2 and froms[0].endswith(" AS build"), "%s: a build and a runtime stage: "
          "%s" % (name, froms))
    check(re.fullmatch(base, froms[-1]) is not None, "%s: runtime base %s" % (name, froms[-1]))
    if name == "Dockerfile.cuda":
        check(args.get("CUDA", "").strip('"').startswith("13.0"), "%s: CUDA 13.0 (%s)" %
              (name, args.get("CUDA")))
        check("-devel-" in froms[0], "%s: builds on the devel image" % name)
    else:
        check(args.get("DEBIAN") == "bookworm", "%s: Debian 12 (%s)" % (name, args.get("DEBIAN")))
    runtime = ins[[i for i, (w, _) in enumerate(ins) if w == "FROM"][-1]:]
    run = " ".join(a for w, a in runtime if w == "RUN")
    check("runtime-packages.txt" in run and "apt-get install" in run and
          "--no-install-recommends" in run, "%s: runtime libraries from runtime-deps.sh" % name)
    check(not re.search(r"-dev\b|build-essential|cmake", run), "%s: nothing to build with in "
          "the runtime stage" % name)
    build = " ".join(a for w, a in ins[:len(ins) - len(runtime)] if w == "RUN")
    check("docker/runtime-deps.sh" in build and "cmake --install" in build,
          "%s: the build stage installs the binaries and finds their libraries" % name)
    check(("USER", "10001:10001") in runtime and "useradd --uid 10001" in run,
          "%s: runs as user 10001" % name)
    check(("ENTRYPOINT", '["/usr/local/bin/tandem-entrypoint"]') in runtime,
          "%s: the one entrypoint" % name)
    copies = [a for w, a in ins if w == "COPY"]
    check(any("models/" in c and "/opt/tandem/models" in c for c in copies),
          "%s: the demo models" % name)
    for c in copies:
        parts = [p for p in c.split() if not p.startswith("--")]
        if any(p.startswith("--from") for p in c.split()):
            continue
        for s in parts[:-1]:
            s = s.rstrip("/")
            check(s == "." or os.path.exists(os.path.join(SRC, s)), "%s: COPY %s: no such file" %
                  (name, s))
            check(not any(fnmatch.fnmatch(s, pat) for pat in ignored),
                  "%s: COPY %s is left out by .dockerignore" % (name, s))
print("dockerfiles: %d failure(s)" % len(FAILURES))
sys.exit(1 if FAILURES else 0)
