//! Helpers shared by the benchmarks: sizes from the environment, and the peer tools that
//! `bench/install-peers.sh` puts in `.bench-tools/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A size from the environment, or the default.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.bench-tools")
}

/// A peer tool: from `.bench-tools/bin`, `.bench-tools/venv/bin`, or `PATH`.
pub fn tool(name: &str) -> Option<PathBuf> {
    let t = tools_dir();
    [t.join("bin").join(name), t.join("venv/bin").join(name)]
        .into_iter()
        .chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join(name)),
        )
        .find(|p| p.is_file())
}
