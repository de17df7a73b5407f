#!/usr/bin/env bash
# Installs the Debian packages tandem builds and tests with. Idempotent: does
# nothing when everything is already there.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
      libpcre2-dev libcjson-dev libyaml-dev libssl-dev libutf8proc-dev openssl
      python3 python3-grpcio python3-grpc-tools python3-protobuf python3-numpy)
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
