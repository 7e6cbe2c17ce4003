#!/usr/bin/env bash
# MySQL for the tests (issue 47): Debian unstable's MySQL server and client (9.7), as a root
# file system built with mmdebstrap — the machines run bookworm, whose C library MySQL 9.7
# does not run on, so the root carries its own. Built once per machine, cached outside the
# checkout, in $TIDEMARK_MYSQL_DIR (default ~/.cache/tidemark/mysql-9.7)/rootfs/: the tests
# run mysqld in it (chroot). Prints that root's path. Nothing of the machine's own apt sources is changed: the unstable
# source is given to mmdebstrap alone (its Release file is allowed to have expired).
# Usage: scripts/mysql-root.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${TIDEMARK_MYSQL_DIR:-$HOME/.cache/tidemark/mysql-9.7}"
log() { printf '==> %s\n' "$*" >&2; }

if [ -x "$DIR/rootfs/usr/sbin/mysqld" ]; then
  echo "$DIR/rootfs"
  exit 0
fi
if ! command -v mmdebstrap >/dev/null; then
  log "installing mmdebstrap with apt-get"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >&2
fi
MIRROR="$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$(dirname "$DIR")"
WORK="$(mktemp -d "$DIR.partial.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "MySQL root file system (Debian unstable's mysql-server-core, mysql-client-core)"
# The server refuses to start without its secure-file-priv directory; its user is 999:999
# as in the official image.
mmdebstrap --quiet --variant=minbase --format=tar --skip=cleanup/run \
  --aptopt='Acquire::Check-Valid-Until "false"' \
  --include=mysql-server-core,mysql-client-core \
  --customize-hook='chroot "$1" groupadd --system -g 999 mysql' \
  --customize-hook='chroot "$1" useradd --system -u 999 -g 999 -d /var/lib/mysql -s /usr/sbin/nologin mysql' \
  --customize-hook='mkdir -p "$1"/var/lib/mysql "$1"/var/lib/mysql-files "$1"/run/mysqld' \
  --customize-hook='chroot "$1" chown mysql:mysql /var/lib/mysql /var/lib/mysql-files /run/mysqld' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  sid "$WORK/rootfs.tar" "deb $MIRROR sid main" >&2
mkdir "$WORK/rootfs"
tar -C "$WORK/rootfs" -xf "$WORK/rootfs.tar"
rm "$WORK/rootfs.tar"
version="$(chroot "$WORK/rootfs" /usr/sbin/mysqld --version)"
log "$version"
rm -rf "$DIR"
mv "$WORK" "$DIR"
trap - EXIT
echo "$DIR/rootfs"
