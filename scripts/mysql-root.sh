#!/usr/bin/env bash
# MySQL for the tests (issue 47): Debian unstable's MySQL server and client (9.7), as a root
# file system built with mmdebstrap — the machines run bookworm, whose C library MySQL 9.7
# does not run on, so the root carries its own. Built once per machine, cached outside the
# checkout, in $TIDEMARK_MYSQL_DIR (default /var/cache/tidemark/mysql-9.7)/rootfs/: the
# tests run mysqld in it (chroot), and Tidemark runs its programs from the host through
# the wrappers in bin/ beside it (each runs the root's program with the root's own dynamic
# loader and libraries, on the host's paths). The directory is readable by every user: a
# private server Tidemark starts as its server user loads its plugins from there. Prints
# the root's path. Nothing of the machine's own apt sources is changed: the unstable
# source is given to mmdebstrap alone (its Release file is allowed to have expired).
# Usage: scripts/mysql-root.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${TIDEMARK_MYSQL_DIR:-/var/cache/tidemark/mysql-9.7}"
log() { printf '==> %s\n' "$*" >&2; }

# bin/: mysqld, mysql, mysqlbinlog, mysqldump and mysqladmin of the root, run on the
# host. mysqld is told where its messages, character sets and plugins are (its own
# options come after, and win); an options-file option stays first, as mysqld wants it.
wrappers() {
  local root="$DIR/rootfs" bin="$DIR/bin" p path extra
  mkdir -p "$bin"
  for p in mysqld mysql mysqlbinlog mysqldump mysqladmin; do
    path="$root/usr/bin/$p"
    extra="--character-sets-dir=$root/usr/share/mysql/charsets"
    if [ "$p" = mysqld ]; then
      path="$root/usr/sbin/mysqld"
      extra="--basedir=$root/usr --lc-messages-dir=$root/usr/share/mysql $extra --plugin-dir=$root/usr/lib/mysql/plugin"
    fi
    {
      echo '#!/bin/sh'
      echo "# $p of the MySQL root $root (scripts/mysql-root.sh), with the root's own C library."
      echo 'first='
      echo 'case "$1" in --no-defaults|--defaults-file=*|--defaults-extra-file=*) first="$1"; shift;; esac'
      echo "exec $root/lib64/ld-linux-x86-64.so.2 --library-path $root/usr/lib/x86_64-linux-gnu --argv0 $p $path \$first $extra \"\$@\""
    } >"$bin/$p.new"
    chmod 755 "$bin/$p.new"
    mv "$bin/$p.new" "$bin/$p"
  done
  chmod 755 "$DIR" "$bin"
}

if [ -x "$DIR/rootfs/usr/sbin/mysqld" ]; then
  wrappers
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
wrappers
"$DIR/bin/mysqld" --version >&2
echo "$DIR/rootfs"
