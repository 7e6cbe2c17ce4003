#!/usr/bin/env bash
# The MySQL image of the real-node scenario (issue 47): the root file system
# scripts/mysql-root.sh builds (Debian unstable's MySQL 9.7, user mysql 999:999), packed as a
# one-layer OCI image named tidemark.test/mysql:9.7 — the StatefulSet's database image, and
# so the image the operator's backup, archive and restore Jobs run MySQL's programs from.
# Built once, cached beside the root ($TIDEMARK_MYSQL_DIR, default
# /var/cache/tidemark/mysql-9.7/mysql-image.tar); prints the archive's path.
# Usage: scripts/mysql-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${TIDEMARK_MYSQL_DIR:-/var/cache/tidemark/mysql-9.7}"
REF="tidemark.test/mysql:9.7"
OUT="$DIR/mysql-image.tar"
root="$(scripts/mysql-root.sh)"
if [ -s "$OUT" ] && [ "$OUT" -nt "$root/usr/sbin/mysqld" ]; then
  echo "$OUT"
  exit 0
fi
if ! command -v umoci >/dev/null; then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq umoci >&2
fi
started=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The tests' servers live in /srv of the root while they run: not part of the image.
tar -C "$root" --numeric-owner --exclude='./srv/*' -cf "$work/rootfs.tar" .
scripts/oci-image.sh "$work/rootfs.tar" "$REF" "$OUT.tmp" \
  --config.cmd mysqld --config.user 999:999 \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mv "$OUT.tmp" "$OUT"
printf '==> %s: %s in %s s\n' "$REF" "$(du -h "$OUT" | cut -f1)" "$(($(date +%s) - started))" >&2
echo "$OUT"
