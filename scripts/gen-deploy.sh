#!/usr/bin/env bash
# Regenerates what deploy/ derives from the code: the CRDs (deploy/crds/ and the Helm
# chart's copy), and the chart's README from its values.yaml. Tests fail when these drift (crates/api/tests/crds.rs,
# crates/operator/tests/deploy.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
# Into a temporary file first: a build that fails leaves the CRDs as they were.
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
cargo run -q -p tidemark -- crds > "$tmp"
test -s "$tmp"
cp "$tmp" deploy/crds/tidemark.io.yaml
cp "$tmp" deploy/helm/tidemark/crds/tidemark.io.yaml
# The chart's README, from the comments of its values.yaml.
python3 scripts/chart-readme.py > "$tmp"
cp "$tmp" deploy/helm/tidemark/README.md
