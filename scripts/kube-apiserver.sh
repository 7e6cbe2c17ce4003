#!/usr/bin/env bash
# Builds a real Kubernetes control plane and node (v1.20.2, from Debian bookworm's
# `kubernetes` source package: kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy) and unpacks etcd and kubectl, once per machine, for the operator's
# tests. Nothing is installed system-wide; the result is cached outside the checkout:
#
#   ${TIDEMARK_KUBE_DIR:-~/.cache/tidemark/kube-1.20.2}/bin/{kube-apiserver,kube-controller-manager,
#       kube-scheduler,kubelet,kube-proxy,etcd,kubectl}
#
# Usage: scripts/kube-apiserver.sh      (prints the bin directory; a no-op when cached)
# A cold build takes about 4-5 minutes of 2 cores (measured 2026-11-24; docs/benchmarks.md)
# and ~2 GB of Go cache (removed after).
# See ../shared/kube-apiserver.md for why each step is here.
set -euo pipefail

KUBE_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
OUT="${TIDEMARK_KUBE_DIR:-$HOME/.cache/tidemark/kube-1.20.2}"
BIN="$OUT/bin"

log() { printf '==> %s\n' "$*" >&2; }

BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy"
cached=yes
for b in $BINARIES etcd kubectl; do [ -x "$BIN/$b" ] || cached=no; done
if [ "$cached" = yes ]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$OUT"
WORK="$OUT/build"
rm -rf "$WORK"
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/apt/parts" "$WORK/debs"

# A private apt configuration with a deb-src line, leaving the system's untouched.
MIRROR="$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
cat >"$WORK/apt/sources.list" <<EOF
deb-src $MIRROR bookworm main
deb-src $MIRROR bookworm-updates main
deb $MIRROR bookworm main
EOF
cat >"$WORK/apt/apt.conf" <<EOF
Dir::State::Lists "$WORK/apt/lists";
Dir::Cache "$WORK/apt/cache";
Dir::Etc::SourceList "$WORK/apt/sources.list";
Dir::Etc::SourceParts "$WORK/apt/parts";
EOF
export APT_CONFIG="$WORK/apt/apt.conf"

log "fetching Debian's kubernetes source ${KUBE_SRC_VERSION} and the Go toolchain"
apt-get update -qq >&2
(
  cd "$WORK/debs"
  apt-get source --download-only -qq "kubernetes=${KUBE_SRC_VERSION}" >&2
  apt-get download -qq golang-1.19-go golang-1.19-src etcd-server golang-github-modern-go-reflect2-dev \
    "kubernetes-client=${KUBE_SRC_VERSION}" >&2
)

log "unpacking"
ROOT="$WORK/root"
mkdir -p "$ROOT"
for deb in "$WORK"/debs/*.deb; do dpkg -x "$deb" "$ROOT"; done
SRC="$WORK/src"
mkdir -p "$SRC"
orig="$(ls "$WORK"/debs/kubernetes_*.orig.tar.* | head -n 1)"
tar -xf "$orig" -C "$SRC" --strip-components=1

# The vendored reflect2 1.0.1 crashes under Go >= 1.18 on the first custom-resource
# create; Debian's 1.0.2 does not.
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
cp -r "$ROOT/usr/share/gocode/src/github.com/modern-go/reflect2" "$SRC/vendor/github.com/modern-go/reflect2"
find "$SRC/vendor/github.com/modern-go/reflect2" -name '*_test.go' -delete

GOROOT="$ROOT/usr/lib/go-1.19"
log "building $BINARIES (about 5 minutes on 2 cores)"
(
  cd "$SRC"
  env PATH="$GOROOT/bin:$PATH" GOROOT="$GOROOT" GOCACHE="$WORK/gocache" GOPATH="$WORK/gopath" \
    HOME="$WORK" CGO_ENABLED=0 \
    make WHAT="$(printf 'cmd/%s ' $BINARIES)" KUBE_BUILD_PLATFORMS=linux/amd64 >&2
)

mkdir -p "$BIN.tmp"
for b in $BINARIES; do cp "$SRC/_output/local/bin/linux/amd64/$b" "$BIN.tmp/"; done
cp "$ROOT/usr/bin/etcd" "$BIN.tmp/etcd"
# Debian's kubectl 1.20.2 (the machine may have another; installing this one conflicts).
cp "$ROOT/usr/bin/kubectl" "$BIN.tmp/kubectl"
"$BIN.tmp/kube-apiserver" --version >&2
rm -rf "$BIN"
mv "$BIN.tmp" "$BIN"
rm -rf "$WORK"
echo "$BIN"
