#!/usr/bin/env bash
# The operator image from a `tidemark` binary, as an OCI archive for `ctr images import`:
# the layout of scripts/image-rootfs.sh (the same as deploy/Dockerfile's image), user
# 65532, entrypoint /tidemark, command `operator`. The real-node tests make it from the
# binary they built; it takes a few seconds.
#
# Usage: scripts/operator-image.sh BINARY REF OUT_TAR
#   e.g. scripts/operator-image.sh target/debug/tidemark ghcr.io/tidemark/tidemark:0.1.0 /tmp/operator.tar
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$1"
ref="$2"
out="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
scripts/image-rootfs.sh "$bin" "$work/rootfs"
tar -C "$work/rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/rootfs.tar" .
scripts/oci-image.sh "$work/rootfs.tar" "$ref" "$out" \
  --config.entrypoint /tidemark --config.cmd operator --config.user 65532:65532 >&2
