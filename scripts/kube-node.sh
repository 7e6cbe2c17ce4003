#!/usr/bin/env bash
# What the operator's real-node tests need beside the control plane, once per machine:
#   - Debian packages: containerd (1.6, CRI v1alpha2 as kubelet 1.20 speaks), runc, the CNI
#     plugins, iptables, conntrack, dnsmasq-base (the node's cluster DNS), mmdebstrap and
#     umoci (images without a registry), gcc;
#   - the Kubernetes binaries (kube-apiserver, kube-controller-manager, kube-scheduler,
#     kubelet, kube-proxy, etcd, kubectl) through scripts/kube-apiserver.sh;
#   - two images as archives `ctr images import` loads: a pause image (a tiny static
#     program) and a MariaDB image (Debian bookworm's mariadb-server, mariadb-backup,
#     mariadb-client). The operator image is made from the binary under test, by
#     scripts/operator-image.sh, when the tests start.
# Everything is cached outside the checkout:
#
#   ${TIDEMARK_NODE_DIR:-~/.cache/tidemark/node-<recipe>}/{pause.tar,mariadb.tar}
#
# Usage: scripts/kube-node.sh     (prints the images directory; a no-op when cached)
# Cold: under a minute for the images (23-52 s measured; Debian packages from the mirror),
# plus the Kubernetes build when that is not cached.
set -euo pipefail
cd "$(dirname "$0")/.."

# Bump when an image's recipe below changes, so that stale archives are not reused.
RECIPE=3
OUT="${TIDEMARK_NODE_DIR:-$HOME/.cache/tidemark/node-$RECIPE}"
# The names the tests use (kept in sync with crates/operator/src/testkit/node.rs).
PAUSE_IMAGE="tidemark.test/pause:1"
MARIADB_IMAGE="tidemark.test/mariadb:10.11"

log() { printf '==> %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

PACKAGES="containerd runc containernetworking-plugins iptables conntrack kmod dnsmasq-base mmdebstrap umoci gcc libc6-dev binutils ca-certificates openssl util-linux iproute2 python3"
missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  log "installing$missing with apt-get"
  as_root apt-get update -qq >&2
  # Debian's containerd package would start a system daemon where an init system runs;
  # the tests run their own, in namespaces of their own, and never touch that one.
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends $missing >&2
fi

scripts/kube-apiserver.sh >/dev/null

if [ -s "$OUT/pause.tar" ] && [ -s "$OUT/mariadb.tar" ]; then
  echo "$OUT"
  exit 0
fi
mkdir -p "$OUT"
WORK="$(mktemp -d "$OUT/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

started=$(date +%s)
log "pause image"
mkdir -p "$WORK/pause/rootfs"
cat >"$WORK/pause/pause.c" <<'EOF'
/* The pod sandbox's process: sleeps, reaps children, exits on TERM or INT. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
EOF
gcc -static -Os -s -o "$WORK/pause/rootfs/pause" "$WORK/pause/pause.c"
tar -C "$WORK/pause/rootfs" --owner=0 --group=0 -cf "$WORK/pause/rootfs.tar" pause
scripts/oci-image.sh "$WORK/pause/rootfs.tar" "$PAUSE_IMAGE" "$OUT/pause.tar" --config.entrypoint /pause --config.user 65535:65535 >&2

log "MariaDB image (Debian bookworm's packages, with mmdebstrap)"
MIRROR="$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
# Like many minimal database images it has no CA certificates; its mysql user is 999:999 as
# in the official image.
mmdebstrap --quiet --variant=minbase --format=tar --skip=cleanup/run \
  --include=mariadb-server,mariadb-backup,mariadb-client \
  --customize-hook='rm -rf "$1"/var/lib/mysql/* "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  --customize-hook='chroot "$1" groupmod -g 999 mysql && chroot "$1" usermod -u 999 -g 999 mysql' \
  --customize-hook='mkdir -p "$1"/run/mysqld && chroot "$1" chown -R mysql:mysql /run/mysqld /var/lib/mysql' \
  bookworm "$WORK/mariadb.rootfs.tar" "deb $MIRROR bookworm main" >&2
scripts/oci-image.sh "$WORK/mariadb.rootfs.tar" "$MARIADB_IMAGE" "$OUT/mariadb.tar" \
  --config.cmd mariadbd --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
log "images built in $(($(date +%s) - started)) s: $(du -h "$OUT/pause.tar" | cut -f1) pause, $(du -h "$OUT/mariadb.tar" | cut -f1) MariaDB"
echo "$OUT"
