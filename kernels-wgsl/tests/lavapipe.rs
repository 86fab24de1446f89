//! The WGSL kernels on a real Vulkan device (lavapipe on CPU-only machines)
//! against the CPU references in `moe_kernels::reference`.
//!
//! Without an adapter the tests print a notice and pass, except under
//! `CI=true`, where they fail with the install hint.

use std::sync::OnceLock;

use moe_kernels::reference::{self, decode, encode};
use moe_kernels::{block_on, ElemDtype, Gpu, KernelError};

const DTYPES: [ElemDtype; 3] = [ElemDtype::F32, ElemDtype::F16, ElemDtype::Bf16];

fn open() -> Option<Gpu> {
    match Gpu::new_blocking() {
        Ok(g) => Some(g),
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "{e}\nCI=true: the GPU kernels must be tested; apt-get install -y mesa-vulkan-drivers libvulkan1"
                );
            }
            eprintln!("NOTICE: skipping the GPU kernel tests: {e}");
            None
        }
    }
}

/// One device for the whole binary (tests run in parallel threads).
fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Option<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let g = open();
        if let Some(g) = &g {
            eprintln!("GPU: {}", g.describe());
        }
        g
    })
    .as_ref()
}

/// Deterministic values in about [-4, 4], with zeros, negative zeros and
/// (for 16-bit dtypes) values that round, overflow f16 or are f16-subnormal.
fn values(n: usize, seed: u64, dtype: ElemDtype) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            match (i % 97, dtype) {
                (0, _) => 0.0,
                (1, _) => -0.0,
                (2, ElemDtype::F16) => 3.0e-6 * (u - 0.5),    // f16 subnormal
                (3, ElemDtype::F16) => 60000.0 + 10000.0 * u, // sums overflow f16
                (4, _) => 1.0e4 * (u - 0.5),
                _ => 8.0 * (u - 0.5),
            }
        })
        .collect()
}

/// Compares bytes exactly, naming the first differing element.
fn assert_same(what: &str, dtype: ElemDtype, gpu: &[u8], cpu: &[u8]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: length");
    if gpu != cpu {
        let (g, c) = (decode(dtype, gpu), decode(dtype, cpu));
        let bad: Vec<usize> = (0..g.len()).filter(|&i| g[i].to_bits() != c[i].to_bits()).collect();
        let i = bad[0];
        panic!("{what}: {} of {} elements differ; first at {i}: gpu {} cpu {}", bad.len(), g.len(), g[i], c[i]);
    }
}

fn check_elementwise(gpu: &Gpu, dtype: ElemDtype, n: usize, tag: &str) {
    let t = encode(dtype, &values(n, 1, dtype));
    let i = encode(dtype, &values(n, 2, dtype));
    // Base equals instruct on every 5th element: zero deltas keep the target.
    let mut bv = values(n, 3, dtype);
    let iv = decode(dtype, &i);
    for k in (0..n).step_by(5) {
        bv[k] = iv[k];
    }
    let b = encode(dtype, &bv);
    let what = format!("{tag} {} n={n}", dtype.name());

    let w = [0.5f32, -1.25, 2.0];
    let got = block_on(gpu.weighted_sum(&[&t, &i, &b], &w, dtype)).expect("weighted_sum");
    assert_same(&format!("weighted_sum {what}"), dtype, &got, &reference::weighted_sum(&[&t, &i, &b], &w, dtype));

    let got = block_on(gpu.weighted_sum(&[&t], &[0.3], dtype)).expect("weighted_sum of one");
    assert_same(&format!("weighted_sum(1) {what}"), dtype, &got, &reference::weighted_sum(&[&t], &[0.3], dtype));

    let got = block_on(gpu.delta(&i, &b, dtype)).expect("delta");
    assert_same(&format!("delta {what}"), dtype, &got, &reference::weighted_sum(&[&i, &b], &[1.0, -1.0], dtype));

    for scale in [1.0f32, 0.7] {
        let got = block_on(gpu.graft(&t, &i, &b, scale, dtype)).expect("graft");
        assert_same(&format!("graft s={scale} {what}"), dtype, &got, &reference::graft(&t, &i, &b, scale, dtype));
    }
    if dtype == ElemDtype::F32 && n > 1 {
        // The graft equals the CLI's arithmetic (scaled delta, then add).
        let (tv, bv) = (decode(dtype, &t), decode(dtype, &b));
        let got = decode(dtype, &block_on(gpu.graft(&t, &i, &b, 0.7, dtype)).expect("graft"));
        let cli = reference::graft_f32(&tv, &iv, &bv, 0.7);
        for k in 0..n {
            if 0.7 * (iv[k] - bv[k]) != 0.0 {
                assert_eq!(got[k].to_bits(), cli[k].to_bits(), "graft f32 element {k}");
            }
        }
    }
}

#[test]
fn elementwise_kernels_match_the_cpu_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    for dtype in DTYPES {
        for n in [1usize, 2, 3, 255, 256, 257, 1_000_003] {
            check_elementwise(gpu, dtype, n, "whole");
        }
    }
}

#[test]
fn elementwise_kernels_split_tensors_over_the_binding_limit() {
    if gpu().is_none() {
        return;
    }
    // 1 KiB bindings: chunks of 256 elements (the f32 accumulator) or 512.
    let small = open().expect("adapter seen above").with_max_binding_bytes(1024);
    assert_eq!(small.max_binding_bytes(), 1024);
    for dtype in DTYPES {
        for n in [255usize, 256, 511, 513, 1000, 1001, 4097] {
            check_elementwise(&small, dtype, n, "chunked");
        }
    }
}

#[test]
fn elementwise_rejects_mismatched_inputs() {
    let Some(gpu) = gpu() else { return };
    let a = encode(ElemDtype::F32, &[1.0, 2.0]);
    let b = encode(ElemDtype::F32, &[1.0]);
    let e = block_on(gpu.delta(&a, &b, ElemDtype::F32)).expect_err("lengths differ");
    assert!(matches!(e, KernelError::Invalid(_)), "{e}");
    let e = block_on(gpu.weighted_sum(&[&a, &a], &[1.0], ElemDtype::F32)).expect_err("one weight");
    assert!(e.to_string().contains("one weight per tensor"), "{e}");
    let e = block_on(gpu.graft(&a[..3], &a[..3], &a[..3], 1.0, ElemDtype::Bf16)).expect_err("odd bytes");
    assert!(e.to_string().contains("whole bf16"), "{e}");
    assert!(block_on(gpu.weighted_sum(&[&[]], &[1.0], ElemDtype::F16)).expect("empty").is_empty());
}

/// Rows `[x, 1]` (the router bias column) and one-hot `y` of expert `r % e`.
fn ridge_rows(n: usize, d: usize, e: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let v = values(n * d, seed, ElemDtype::F32);
    let mut x = Vec::with_capacity(n * (d + 1));
    let mut y = vec![0f32; n * e];
    for r in 0..n {
        x.extend(v[r * d..(r + 1) * d].iter().map(|z| z.clamp(-4.0, 4.0)));
        x.push(1.0);
        y[r * e + (r * 7 + seed as usize) % e] = 1.0;
    }
    (x, y)
}

fn check_gram(gpu: &Gpu, d: usize, e: usize, batches: &[usize]) {
    let p = d + 1;
    let mut acc = gpu.gram(p, e).expect("gram");
    let (mut a, mut b) = (vec![0f64; p * p], vec![0f64; p * e]);
    for (k, &n) in batches.iter().enumerate() {
        let (x, y) = ridge_rows(n, d, e, k as u64 + 10);
        acc.add(&x, &y).expect("add");
        reference::gram_accumulate(&mut a, &mut b, &x, &y, p, e);
    }
    assert_eq!(acc.rows(), batches.iter().sum::<usize>() as u64);
    let (ga, gb) = block_on(acc.read()).expect("read");
    for (name, g, c) in [("A", &ga, &a), ("B", &gb, &b)] {
        let scale = c.iter().fold(0f64, |m, v| m.max(v.abs()));
        let err = g.iter().zip(c.iter()).fold(0f64, |m, (g, c)| m.max((f64::from(*g) - c).abs()));
        eprintln!("gram d={d} e={e} rows={batches:?}: {name} max |gpu - f64| = {err:.3e} (max |{name}| = {scale:.3e})");
        assert!(err <= 1e-4 * scale, "{name}: max error {err} vs scale {scale}");
    }
    // B's bias row counts each expert's rows exactly.
    let total: f32 = gb[d * e..].iter().sum();
    assert_eq!(total, batches.iter().sum::<usize>() as f32);
}

#[test]
fn gram_matches_the_f64_reference_over_several_batches() {
    let Some(gpu) = gpu() else { return };
    // p, e and the rows are not multiples of the 64x64 tile or of 16 rows.
    check_gram(gpu, 36, 3, &[1, 50, 123]);
    check_gram(gpu, 130, 5, &[17, 300]);
    // SmolLM2's hidden size with a bias column, a few domains.
    check_gram(gpu, 576, 4, &[1000, 777]);
}

#[test]
fn gram_splits_batches_over_the_binding_limit() {
    if gpu().is_none() {
        return;
    }
    // 4 KiB bindings: 51 rows of p = 20 per dispatch.
    let small = open().expect("adapter seen above").with_max_binding_bytes(4096);
    check_gram(&small, 19, 2, &[200, 3, 51]);
    let e = small.gram(40, 2).expect_err("A of 40x40 f32 is 6400 bytes");
    assert!(matches!(e, KernelError::TooLarge(_)), "{e}");
    let mut acc = small.gram(4, 2).expect("gram");
    let e = acc.add(&[1.0; 8], &[1.0; 3]).expect_err("y of 2 rows needs 4 values");
    assert!(matches!(e, KernelError::Invalid(_)), "{e}");
    acc.add(&[1.0; 8], &[1.0; 4]).expect("add");
    acc.clear();
    let (a, b) = block_on(acc.read()).expect("read");
    assert!(a.iter().chain(&b).all(|&v| v == 0.0) && acc.rows() == 0);
}
