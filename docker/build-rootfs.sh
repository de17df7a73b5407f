#!/usr/bin/env bash
# Builds tandem's CPU image without a Docker daemon, as an OCI image layout:
# the runtime stage of docker/Dockerfile made with Debian's debootstrap (a
# minbase Debian 12 with only the shared libraries the binaries load, as
# docker/runtime-deps.sh finds them) and umoci (the layer, the image config:
# user 10001, entrypoint, ports). The build stage is a tandem build folder
# configured on this Debian 12 machine (scripts/build.sh), standing in for
# the Dockerfile's build stage on the same distribution.
#
#   docker/build-rootfs.sh --build BUILD_DIR --out OUT_DIR [--cache DIR]
#                          [--mirror URL] [--suite bookworm] [--tag cpu]
#
# OUT_DIR/oci is the image layout (tag `cpu`): `umoci unpack --image
# OUT_DIR/oci:cpu BUNDLE` unpacks it, `skopeo copy oci:OUT_DIR/oci:cpu
# docker-daemon:tandem:cpu` (elsewhere) loads it. The debootstrapped base is
# kept in the cache folder (default BUILD_DIR/image-cache), keyed by suite,
# mirror and package list, so a second build needs no network.
# Needs root (debootstrap, chroot, file ownership in the layer).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="" out="" cache="" tag="cpu"
suite="bookworm" mirror="http://deb.debian.org/debian"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build-rootfs: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] && [ -n "$out" ] || { echo "build-rootfs: --build and --out are required" >&2; exit 2; }
[ -f "$build/CMakeCache.txt" ] || { echo "build-rootfs: $build is not a configured build folder" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "build-rootfs: must run as root (debootstrap, chroot)" >&2; exit 2; }
for t in debootstrap umoci; do
  command -v "$t" >/dev/null || { echo "build-rootfs: $t not found (apt-get install $t)" >&2; exit 2; }
done
cache="${cache:-$build/image-cache}"
build="$(cd "$build" && pwd)"
mkdir -p "$out" "$cache"
out="$(cd "$out" && pwd)"
work="$(mktemp -d "$out/work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
step() { echo "build-rootfs: $*"; }

# 1. The binaries, as `cmake --install` lays them out (stripped).
step "installing the binaries from $build"
cmake --install "$build" --prefix "$work/stage/usr/local" --strip >/dev/null
bins=("$work"/stage/usr/local/bin/tandem*)
[ ${#bins[@]} -eq 4 ] || { echo "build-rootfs: expected 4 binaries, got ${bins[*]}" >&2; exit 1; }
pkgs="$("$root/docker/runtime-deps.sh" "${bins[@]}" | paste -sd, -)"
step "runtime packages: $pkgs"

# 2. An empty image, unpacked to a bundle whose rootfs we fill.
rm -rf "$out/oci"
umoci init --layout "$out/oci"
umoci new --image "$out/oci:$tag"
umoci unpack --image "$out/oci:$tag" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"

# 3. The base: minbase Debian and the runtime libraries, nothing to build with.
key="$(printf '%s\n' "$suite" "$mirror" "$pkgs" | sha256sum | cut -c1-16)"
base="$cache/rootfs-$suite-$key.tar"
if [ -f "$base" ]; then
  step "base from the cache ($base)"
  tar -xf "$base" -C "$rootfs"
else
  step "debootstrap --variant=minbase $suite from $mirror"
  if ! debootstrap --variant=minbase --include="$pkgs" "$suite" "$rootfs" "$mirror" \
      >"$work/debootstrap.log" 2>&1; then
    tail -30 "$work/debootstrap.log" >&2
    echo "build-rootfs: debootstrap failed (log above)" >&2
    exit 1
  fi
  # What Debian's slim images leave out, now and for later installs.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  find "$rootfs/usr/share/doc" -mindepth 2 -not -name copyright -not -type d -delete 2>/dev/null || true
  rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
         "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
  find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  tar -cf "$base.tmp" -C "$rootfs" . && mv "$base.tmp" "$base"
fi

# 4. tandem: an unprivileged user, the binaries, the demo models, the entrypoint.
step "adding tandem"
chroot "$rootfs" useradd --uid 10001 --user-group --home-dir /var/lib/tandem \
  --create-home --shell /usr/sbin/nologin tandem
cp -a "$work/stage/usr/local/bin/." "$rootfs/usr/local/bin/"
mkdir -p "$rootfs/opt/tandem"
cp -a "$root/models" "$rootfs/opt/tandem/models"
chown -R root:root "$rootfs/opt/tandem"
install -m 0755 "$root/docker/entrypoint.sh" "$rootfs/usr/local/bin/tandem-entrypoint"
# A build with the CUDA backend links the CUDA runtime, which no Debian package
# holds (runtime-deps.sh leaves it to the CUDA base image): it goes in beside
# the binaries, which then start on a machine without a GPU and pick the cpu
# backend there. cuBLAS is opened only by a prefill on a GPU, so this image
# goes without it.
ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(readlink -f "$lib")" in
    */cuda*/* | */libcudart*) cp -L "$lib" "$rootfs/usr/local/lib/" ;;
  esac
done
chroot "$rootfs" ldconfig

# 5. The layer and the image's configuration (as docker/Dockerfile sets it).
step "packing the layer (umoci repack)"
umoci repack --image "$out/oci:$tag" "$work/bundle"
ports=()
for p in 7700 7701 7702 7710 7711 7712 7720 7721 7722; do ports+=(--config.exposedports "$p/tcp"); done
umoci config --image "$out/oci:$tag" --config.user 10001:10001 --config.workingdir /var/lib/tandem \
  --config.entrypoint /usr/local/bin/tandem-entrypoint --config.cmd help \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  "${ports[@]}" --author tandem \
  --config.label org.opencontainers.image.title=tandem \
  --config.label org.opencontainers.image.description="tandem (CPU): gateway, verifier, drafter, CLI"
umoci gc --layout "$out/oci"
step "image $out/oci:$tag ($(du -sh "$out/oci" | cut -f1))"
