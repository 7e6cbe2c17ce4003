#!/usr/bin/env bash
# The chaos soak (issue 48 §2; docs/soak.md): the operator, a replicated MariaDB under a
# steady write load, a store and the API server on the real test node, with faults
# injected at random — then every sampled instant of the recovery window restored and
# compared with what the load had committed by then.
#
# Usage: scripts/soak.sh [--duration 1h] [--seed N] [--samples N] [--report FILE]
#   --duration  how long faults are injected (s, m or h; default 1h); the suite runs
#               a short one (120 s) as the node scenario `a_chaos_soak`
#   --seed      replays a soak's choices (the report names its seed)
#   --samples   how many marks to restore at least (default 24; at least 20 for a soak
#               of 10 minutes or more; 8 in the short one)
#   --report    where the report goes (default: soak-report-<time>.txt in the checkout)
# Installs what it needs as scripts/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

duration="1h"
seed=""
samples=""
report="soak-report-$(date -u +%Y%m%dT%H%M%SZ).txt"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="${2:?--duration needs a value, e.g. 1h}"; shift 2 ;;
    --seed) seed="${2:?--seed needs a number}"; shift 2 ;;
    --samples) samples="${2:?--samples needs a number}"; shift 2 ;;
    --report) report="${2:?--report needs a file}"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown argument $1; expected --duration D, --seed N, --samples N or --report FILE" >&2; exit 2 ;;
  esac
done
if [[ "$duration" =~ ^([0-9]+)([smh])$ ]]; then
  n=$((10#${BASH_REMATCH[1]}))
  case "${BASH_REMATCH[2]}" in
    s) seconds=$n ;;
    m) seconds=$((n * 60)) ;;
    h) seconds=$((n * 3600)) ;;
  esac
else
  echo "--duration $duration: expected a whole number with s, m or h, e.g. 90s, 20m, 1h" >&2
  exit 2
fi
for n in "$seed" "$samples"; do
  if [ -n "$n" ] && ! [[ "$n" =~ ^[0-9]{1,18}$ ]]; then
    echo "--seed and --samples take whole numbers, not $n" >&2
    exit 2
  fi
done

# shellcheck source=scripts/deps.sh
. scripts/deps.sh
deps_start
deps_wait

# The soak runs here, whatever the environment says (scripts/test.sh's switch included).
unset TIDEMARK_NODE_SCENARIOS
export TIDEMARK_SOAK_SECONDS="$seconds"
[ -n "$seed" ] && export TIDEMARK_SOAK_SEED="$seed"
[ -n "$samples" ] && export TIDEMARK_SOAK_SAMPLES="$samples"
case "$report" in /*) ;; *) report="$PWD/$report" ;; esac
export TIDEMARK_SOAK_REPORT="$report"
log "the chaos soak: ${seconds} s of faults; the report goes to $report"
cargo test -p tidemark --test node --locked -- a_chaos_soak
log "report: $report"
