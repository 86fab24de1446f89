//! Fuzzes the llama2.c checkpoint and tokenizer parsers: arbitrary bytes
//! must give `Ok` or a typed error, never a panic or an allocation beyond
//! what the input holds (a 28-byte header may claim 2^24 layers or tokens).
//! Seeds: `fuzz/seeds/llama2c_header/`; the same bodies run in the stable
//! `shared/tests/hostile_headers.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moe_shared::checkpoint::llama2c::Llama2cModel;
use moe_shared::tensor_io::Bytes;
use moe_shared::tokenizer::Llama2cTokenizer;

fuzz_target!(|data: &[u8]| {
    let vocab = data.get(20..24).map(|b| i32::from_le_bytes(b.try_into().unwrap()).unsigned_abs() as usize);
    let _ = Llama2cTokenizer::parse(data, vocab.unwrap_or(32000), "fuzz-tok");
    let _ = Llama2cModel::parse(Bytes::from_vec(data.to_vec()), "fuzz");
});
