//! Fuzzes the GGUF reader: arbitrary bytes must give `Ok` or a typed error,
//! never a panic, an out-of-bounds read or an allocation far beyond the
//! input size. When a file parses, the config, every tensor read and the
//! tokenizer construction are exercised too (metadata arrays are read
//! lazily: a header of one huge array must cost nothing). Seeds:
//! `fuzz/seeds/gguf_header/`; the same body runs in the stable
//! `shared/tests/hostile_headers.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moe_shared::checkpoint::gguf;
use moe_shared::tensor_io::{Bytes, TensorSource};

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = gguf::open(Bytes::from_vec(data.to_vec()), "fuzz") {
        let _ = model.model_config();
        for t in model.tensors() {
            // Tensors are bounded by the input size, so reading is cheap.
            let _ = model.read_f32(&t.name);
        }
        let _ = moe_shared::tokenizer::gguf::build_tokenizer(&model);
    }
});
