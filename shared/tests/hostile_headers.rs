//! The parsers over hostile headers, in a stable `cargo test` (the fuzz
//! targets of `fuzz/` need nightly): the committed seed corpus
//! `fuzz/seeds/{gguf_header,safetensors_header,llama2c_header}/` (made by
//! `tests/reference/make_hostile_headers.py`; `expected.json` gives the
//! words each error must contain, "" for a file that parses), and large
//! hostile files generated here — a GGUF whose metadata is one 24 MB array,
//! a vocabulary over the limit, a llama2.c header claiming 2^24 layers —
//! whose parse must cost memory for what it keeps, not for what a header
//! claims.
//!
//! This test binary counts every allocation (its own global allocator) and
//! refuses any that would take the live heap over [`BUDGET`], so an
//! unbounded parse aborts the test instead of the machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use moe_shared::checkpoint::gguf::{self, GgufModel};
use moe_shared::checkpoint::llama2c::Llama2cModel;
use moe_shared::tensor_io::gguf::GgufFile;
use moe_shared::tensor_io::safetensors_io::SafetensorsFile;
use moe_shared::tensor_io::{Bytes, TensorSource};
use moe_shared::tokenizer::Llama2cTokenizer;

/// Largest live heap this test binary allows, bytes.
const BUDGET: usize = 1 << 30;

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(l.size(), Ordering::SeqCst) + l.size();
        if now > BUDGET {
            LIVE.fetch_sub(l.size(), Ordering::SeqCst);
            return std::ptr::null_mut();
        }
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: same layout as asked.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
        // SAFETY: allocated by `alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// One measurement at a time (tests run on several threads).
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` and returns its result and the heap it added at its peak, bytes.
fn measured<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let r = f();
    (r, PEAK.load(Ordering::SeqCst).saturating_sub(base))
}

/// What the fuzz target `gguf_header` does with its input.
fn gguf_target(data: Vec<u8>) -> Result<(), String> {
    let model = gguf::open(Bytes::from_vec(data), "fuzz").map_err(|e| e.to_string())?;
    let _ = model.model_config();
    for t in model.tensors() {
        let _ = model.read_f32(&t.name);
    }
    let _ = moe_shared::tokenizer::gguf::build_tokenizer(&model);
    Ok(())
}

/// What the fuzz target `safetensors_header` does.
fn safetensors_target(data: Vec<u8>) -> Result<(), String> {
    SafetensorsFile::parse(Bytes::from_vec(data), "fuzz").map(|_| ()).map_err(|e| e.to_string())
}

/// What the fuzz target `llama2c_header` does: the model, and the bytes as
/// a tokenizer of the vocabulary the header claims (or 32000).
fn llama2c_target(data: Vec<u8>) -> Result<(), String> {
    let vocab = data.get(20..24).map(|b| i32::from_le_bytes(b.try_into().unwrap()).unsigned_abs() as usize);
    let tok = Llama2cTokenizer::parse(&data, vocab.unwrap_or(32000), "fuzz-tok").map(|_| ());
    let model = Llama2cModel::parse(Bytes::from_vec(data), "fuzz").map(|_| ()).map_err(|e| e.to_string());
    model.and(tok.map_err(|e| e.to_string()))
}

#[test]
fn the_seed_corpus_gives_the_expected_errors_within_the_budget() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let expected: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(root.join("expected.json")).unwrap()).unwrap();
    assert!(expected.len() >= 20, "{} corpus files", expected.len());
    for (rel, want) in &expected {
        let data = std::fs::read(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let len = data.len();
        let target = rel.split('/').next().unwrap();
        let (r, peak) = measured(|| match target {
            "gguf_header" => gguf_target(data),
            "safetensors_header" => safetensors_target(data),
            "llama2c_header" => llama2c_target(data),
            other => panic!("unknown target {other}"),
        });
        match (&r, want.is_empty()) {
            (Ok(()), true) => {}
            (Err(e), false) => assert!(e.contains(want.as_str()), "{rel}: error `{e}` lacks `{want}`"),
            (Ok(()), false) => panic!("{rel}: parsed, expected an error with `{want}`"),
            // A file that must parse may still fail later stages (no
            // architecture, no tokenizer): only the header parse counts.
            (Err(e), true) => assert!(!e.contains("malformed"), "{rel}: {e}"),
        }
        // A few hundred bytes in: never more than 1 MB of heap.
        assert!(peak < (1 << 20), "{rel} ({len} bytes) took {peak} bytes of heap");
    }
}

/// A GGUF string (`u64` length + bytes).
fn gstr(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// A GGUF v3 file with no tensors and the encoded key/values `kvs`.
fn gguf_of(kvs: &[Vec<u8>]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        b.extend(kv);
    }
    b
}

/// Key `key` holding an array of `n` `u8`s (type 0) or of `n` one-letter
/// strings (type 8).
fn array_kv(key: &str, elem_type: u32, n: usize) -> Vec<u8> {
    let mut b = Vec::new();
    gstr(&mut b, key);
    b.extend(9u32.to_le_bytes());
    b.extend(elem_type.to_le_bytes());
    b.extend((n as u64).to_le_bytes());
    for i in 0..n {
        match elem_type {
            0 => b.push(i as u8),
            _ => {
                b.extend(1u64.to_le_bytes());
                b.push(b'a' + (i % 26) as u8);
            }
        }
    }
    b
}

fn one_array(elem_type: u32, n: usize) -> Vec<u8> {
    gguf_of(&[array_kv("x", elem_type, n)])
}

#[test]
fn a_large_metadata_array_costs_no_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 24 MB of u8s: 24M GgufValues (32 bytes each, 768 MB) before.
    let data = one_array(0, 24 << 20);
    let len = data.len();
    let (f, peak) = measured(|| GgufFile::parse(Bytes::from_vec(data), "big-u8.gguf").unwrap());
    // The file itself was allocated before the measurement; the parse adds
    // a few small maps.
    assert!(peak < (64 << 10), "a {len}-byte array took {peak} bytes of heap to parse");
    let a = f.get("x").unwrap().as_array().unwrap();
    assert_eq!((a.len(), a.elem_type_name()), (24 << 20, "uint8"));
    assert_eq!(a.iter().nth(300).and_then(|v| v.as_u64()), Some(300 % 256));
    // 2.6M one-letter strings (24 MB): iterated borrowed, never held.
    let data = one_array(8, (24 << 20) / 9);
    let (f, peak) = measured(|| GgufFile::parse(Bytes::from_vec(data), "big-str.gguf").unwrap());
    assert!(peak < (64 << 10), "{peak}");
    let a = f.get("x").unwrap().as_array().unwrap();
    let (n, peak) = measured(|| a.strs().unwrap().filter(|s| *s == "c").count());
    assert_eq!(n, ((24 << 20) / 9 + 23) / 26);
    assert!(peak < (4 << 10), "{peak}");
}

#[test]
fn a_vocabulary_over_the_limit_is_refused_before_it_is_read() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = moe_shared::tokenizer::gguf::MAX_VOCAB + 1;
    let mut kind = Vec::new();
    gstr(&mut kind, "tokenizer.ggml.model");
    kind.extend(8u32.to_le_bytes());
    gstr(&mut kind, "gpt2");
    let b = gguf_of(&[kind, array_kv("tokenizer.ggml.tokens", 8, n)]);
    let model = GgufModel::new(GgufFile::parse(Bytes::from_vec(b), "vocab.gguf").unwrap()).unwrap();
    let (r, peak) = measured(|| moe_shared::tokenizer::gguf::build_tokenizer(&model).map(|_| ()));
    let e = r.unwrap_err().to_string();
    assert!(e.contains("over the limit"), "{e}");
    assert!(peak < (64 << 10), "{peak}");
}

#[test]
fn headers_claiming_huge_sizes_cost_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 28 bytes claiming 2^24 layers: 151M tensor entries were listed
    // before the size was checked.
    let h: Vec<u8> = [64i32, 64, 1 << 24, 8, 8, 32, 16].iter().flat_map(|x| x.to_le_bytes()).collect();
    let (r, peak) = measured(|| Llama2cModel::parse(Bytes::from_vec(h.clone()), "huge.bin").map(|_| ()));
    assert!(r.unwrap_err().to_string().contains("needs exactly"));
    assert!(peak < (64 << 10), "{peak}");
    // A tokenizer file of 8 bytes for a claimed vocabulary of 2^24 tokens.
    let (r, peak) = measured(|| Llama2cTokenizer::parse(&[0u8; 8], 1 << 24, "tok.bin").map(|_| ()));
    assert!(r.is_err());
    assert!(peak < (64 << 10), "{peak}");
    // A safetensors header length of 15 MB over a 16-byte file.
    let mut st = (15u64 << 20).to_le_bytes().to_vec();
    st.extend(b"{}");
    let (r, peak) = measured(|| SafetensorsFile::parse(Bytes::from_vec(st), "x.safetensors").map(|_| ()));
    assert!(r.is_err());
    assert!(peak < (64 << 10), "{peak}");
}
