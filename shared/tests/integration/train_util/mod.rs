//! Shared helpers of the training tests: stories260K upcycled to 4 experts
//! (top-2) in a temporary directory, and small packed mixtures from the
//! shared corpora.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::corpus::{split_documents, token_stream, DocSplit};
use moe_shared::methods::{upcycle, ExpertCounts, RouterInit, UpcycleOptions};
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::tokenizer::Tokenizer;
use moe_shared::train::{DataSpec, Mixture, PackedSource};

use crate::common;

/// stories260K, opened (with its llama2.c tokenizer).
pub fn stories() -> Option<LoadedModel> {
    let path = common::data_file("models/stories260K/stories260K.bin")?;
    Some(open_model(&path).unwrap())
}

/// Upcycles `dense` into `dir/moe` (4 experts, top-2, expert 0 frozen,
/// random router with std `router_std`, f32) and opens it.
pub fn upcycled(dense: &LoadedModel, dir: &Path, router_std: f64) -> LoadedModel {
    upcycled_k(dense, dir, router_std, 2)
}

/// As [`upcycled`] with top-`k` routing, into `dir/moe-k{k}`.
pub fn upcycled_k(dense: &LoadedModel, dir: &Path, router_std: f64, k: usize) -> LoadedModel {
    let out = dir.join(format!("moe-k{k}"));
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(4),
        top_k: k,
        router_init: RouterInit::Random { std: router_std },
        dtype: Some(DType::F32),
        seed: 5,
        ..Default::default()
    };
    upcycle(dense.source.as_ref(), &dense.config, &opts, &out, None, WriteOptions::default()).unwrap();
    open_model(&out).unwrap()
}

/// The first `lines` documents of a shared corpus file, packed into
/// sequences of `seq_len`.
pub fn source(
    tok: &Tokenizer,
    rel: &str,
    name: &str,
    lines: usize,
    seq_len: usize,
    original: bool,
) -> Option<PackedSource> {
    let path: PathBuf = common::data_file(rel)?;
    let text = std::fs::read_to_string(&path).unwrap();
    // One line = one text here (`--docs line`): the tests' sizes are in lines.
    let docs = split_documents(&text, &path.display().to_string(), DocSplit::Line).unwrap();
    let docs: Vec<String> = docs.into_iter().take(lines).collect();
    let ids = token_stream(&docs, tok).unwrap();
    let spec = DataSpec { name: name.into(), path: path.display().to_string(), weight: 1.0, original };
    Some(PackedSource::new(spec, ids, seq_len).unwrap())
}

/// A mixture of Hungarian (new) and, optionally, English (original).
pub fn hu_en(tok: &Tokenizer, seq_len: usize, with_en: bool, seed: u64) -> Option<Mixture> {
    let mut v = vec![source(tok, "corpora/lang/hu/train.txt", "hu", 80, seq_len, false)?];
    if with_en {
        v.push(source(tok, "corpora/lang/en/train.txt", "en", 80, seq_len, true)?);
    }
    Some(Mixture::new(v, seed).unwrap())
}
