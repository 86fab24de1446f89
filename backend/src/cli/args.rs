//! Argument helpers shared by the commands that write checkpoints.

use anyhow::Context;
use moe_shared::checkpoint::{DType, WriteOptions};

/// Parses `--dtype` (`f32`, `f16`, `bf16`; `None` keeps the source's).
pub fn parse_dtype(s: &Option<String>) -> anyhow::Result<Option<DType>> {
    match s {
        Some(s) => {
            Ok(Some(DType::parse_float(s).with_context(|| format!("--dtype `{s}`: expected f32, f16 or bf16"))?))
        }
        None => Ok(None),
    }
}

/// Writer options from `--max-shard-bytes` (default: 5 GB shards).
pub fn write_options(max_shard_bytes: Option<u64>) -> WriteOptions {
    let mut opts = WriteOptions::default();
    if let Some(b) = max_shard_bytes {
        opts.max_shard_bytes = b;
    }
    opts
}
