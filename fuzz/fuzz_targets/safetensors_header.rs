//! Fuzzes the safetensors header parser: arbitrary bytes must give `Ok` or
//! a typed error, never a panic or an allocation far beyond the input size
//! (header length capped, a tensor listed twice refused). Seeds:
//! `fuzz/seeds/safetensors_header/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moe_shared::tensor_io::safetensors_io::SafetensorsFile;
use moe_shared::tensor_io::Bytes;

fuzz_target!(|data: &[u8]| {
    let _ = SafetensorsFile::parse(Bytes::from_vec(data.to_vec()), "fuzz");
});
