#!/bin/sh
# Stages the operator image's file system from a `tidemark` binary. It is the one layout of
# the image users run (deploy/Dockerfile) and of the image the real-node tests run
# (scripts/operator-image.sh):
#
#   /tidemark                           the binary, stripped (backup Jobs copy it from here
#                                       with `tidemark install`)
#   /etc/ssl/certs/ca-certificates.crt  CA roots (Debian's ca-certificates)
#   /etc/passwd, /etc/group             root and the non-root user the operator runs as,
#                                       tidemark 65532:65532
#   /tmp                                (mode 1777)
#   the shared libraries the binary loads, at the paths it loads them from — none for a
#   static binary (deploy/Dockerfile builds one for musl).
#
# Usage: scripts/image-rootfs.sh BINARY DIR
set -eu
bin="$1"
root="$2"
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || { echo "$ca is missing: install Debian's ca-certificates" >&2; exit 1; }
mkdir -p "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
strip -o "$root/tidemark" "$bin"
chmod 0755 "$root/tidemark"
cp "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\ntidemark:x:65532:65532:tidemark:/nonexistent:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\ntidemark:x:65532:\n' >"$root/etc/group"
# A dynamically linked binary: its loader and libraries, resolved as they are here.
if ldd "$bin" >/dev/null 2>&1; then
  ldd "$bin" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p' | sort -u |
    while read -r lib; do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
fi
