#!/usr/bin/env bash
# Regenerates what deploy/ derives from the code: the CRDs (deploy/crds/ and the Helm
# chart's copy). Tests fail when these drift (crates/api/tests/crds.rs,
# crates/operator/tests/deploy.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run -q -p tidemark -- crds > deploy/crds/tidemark.io.yaml
cp deploy/crds/tidemark.io.yaml deploy/helm/tidemark/crds/tidemark.io.yaml
