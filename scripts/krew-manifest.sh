#!/usr/bin/env bash
# Packs the binary for krew (kubectl's plugin manager) and writes the plugin's manifest:
#   OUT/tidemark-<version>-linux-amd64.tar.gz   (tidemark, LICENSE)
#   OUT/tidemark.yaml                           (krew's Plugin, its uri under URL_BASE, its sha256)
# `kubectl krew install --manifest=OUT/tidemark.yaml --archive=OUT/tidemark-…tar.gz` installs
# it from these files; published, the archive goes under URL_BASE. krew links the binary
# as kubectl-tidemark; kubectl's completion of the plugin needs kubectl_complete-tidemark
# on PATH too, which krew cannot make yet (kubernetes-sigs/krew#812): docs/cli.md says how.
# Only linux/amd64 is built here (no arm64 toolchain on these machines; docs/operator.md).
#
# Usage: scripts/krew-manifest.sh BINARY VERSION URL_BASE OUT
#   e.g. scripts/krew-manifest.sh target/release/tidemark v0.1.0 https://example.invalid/tidemark/releases/download/v0.1.0 dist
set -euo pipefail
binary="$1"
version="$2"
url_base="${3%/}"
out="$4"
case "$version" in
  v[0-9]*.[0-9]*.[0-9]*) ;;
  *) echo "krew-manifest.sh: VERSION must be vMAJOR.MINOR.PATCH (krew's form), not '$version'" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
install -m 755 "$binary" "$work/tidemark"
cp "$root/LICENSE" "$work/LICENSE"
archive="tidemark-${version}-linux-amd64.tar.gz"
# Reproducible: fixed owner, order and times, so the same binary gives the same sha256.
tar -C "$work" --owner=0 --group=0 --numeric-owner --sort=name --mtime=@0 -cf - tidemark LICENSE \
  | gzip -n > "$out/$archive"
sha="$(sha256sum "$out/$archive" | cut -d' ' -f1)"
cat > "$out/tidemark.yaml" <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: tidemark
spec:
  version: ${version}
  homepage: https://example.invalid/tidemark
  shortDescription: Back up, restore and retain MariaDB with Tidemark
  description: |
    The Tidemark operator's commands from kubectl: create a Backup and follow it
    (backup), restore a point in time into a claim (restore), a policy's health (status),
    its store and retention plan (ls, plan), a restore test on demand (restore-test),
    and a Backup's or Restore's details and Job log (describe, logs).
  caveats: |
    Completion of "kubectl tidemark" (kubectl 1.26+) needs a link named
    kubectl_complete-tidemark to the same binary on PATH:
      ln -s "\$(command -v kubectl-tidemark)" ~/.krew/bin/kubectl_complete-tidemark
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: amd64
      uri: ${url_base}/${archive}
      sha256: ${sha}
      files:
        - from: tidemark
          to: .
        - from: LICENSE
          to: .
      bin: tidemark
YAML
echo "$out/tidemark.yaml"
