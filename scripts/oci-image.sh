#!/usr/bin/env bash
# Packs a root file system (a tar) as a one-layer OCI image archive named REF, which
# `ctr images import` loads without a registry (it names the image by the archive's
# io.containerd.image.name annotation). Needs umoci.
#
# Usage: scripts/oci-image.sh ROOTFS_TAR REF OUT_TAR [umoci config options...]
#   e.g. scripts/oci-image.sh rootfs.tar example.test/app:1 app.tar --config.entrypoint /app
set -euo pipefail
rootfs="$1"
ref="$2"
out="$3"
shift 3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:img"
umoci raw add-layer --image "$layout:img" "$rootfs"
umoci config --image "$layout:img" "$@"
umoci gc --layout "$layout"
python3 - "$layout/index.json" "$ref" <<'PY'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = ref
json.dump(index, open(path, "w"))
PY
tar -C "$layout" -cf "$out.tmp" .
mv "$out.tmp" "$out"
