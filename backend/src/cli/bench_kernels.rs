//! `moe-studio bench kernels`: the WGSL kernels (crate `moe-studio-kernels`)
//! on this machine's wgpu adapter (lavapipe on CPU-only machines) beside the
//! CPU path the CLI runs, on SmolLM2-size tensors, in the same run:
//!
//! - elementwise (GB/s = bytes of all input and output tensors / seconds):
//!   the graft `target + s * (instruct - base)` of one `[576, 1536]` FFN
//!   matrix against `methods::delta`'s CPU arithmetic (decode to f32,
//!   scaled delta, `add_scaled_delta`, round), and a 3-tensor weighted sum
//!   against the linear merge's loop; f32 and bf16;
//! - Gram (GFLOP/s = `2 n p (p + e)` / seconds): `A += XᵀX`, `B += XᵀY`
//!   for `n` hidden states of `d = 576` plus the bias column, against
//!   `methods::ridge::RidgeStats::accumulate` (f64, faer).
//!
//! GPU times include the upload and the readback (what a caller waits for).

use std::time::Instant;

use anyhow::Context;
use moe_kernels::reference::{decode, encode};
use moe_kernels::{block_on, ElemDtype, Gpu};
use moe_shared::methods::delta::add_scaled_delta;
use moe_shared::methods::ridge::RidgeStats;

/// Arguments of `bench kernels`.
#[derive(Debug, Clone, clap::Args)]
pub struct KernelBenchArgs {
    /// Rows of the elementwise matrices (SmolLM2-135M: hidden size 576).
    #[arg(long, default_value_t = 576)]
    pub rows: usize,
    /// Columns of the elementwise matrices (SmolLM2-135M: FFN size 1536).
    #[arg(long, default_value_t = 1536)]
    pub cols: usize,
    /// Hidden size `d` of the Gram rows (`p = d + 1` with the bias column).
    #[arg(long, default_value_t = 576)]
    pub dim: usize,
    /// Rows (tokens) added to the Gram statistics.
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Experts (one-hot targets) of the Gram statistics.
    #[arg(long, default_value_t = 4)]
    pub experts: usize,
    /// Timed repetitions (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Median seconds of `repeat` runs of `f` after one warm-up.
fn time<T>(repeat: usize, mut f: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<f64> {
    f()?;
    let mut t = Vec::new();
    for _ in 0..repeat.max(1) {
        let t0 = Instant::now();
        std::hint::black_box(f()?);
        t.push(t0.elapsed().as_secs_f64());
    }
    t.sort_by(|a, b| a.total_cmp(b));
    Ok(t[t.len() / 2])
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// One benchmark line.
struct Row {
    name: String,
    unit: &'static str,
    gpu: f64,
    cpu: f64,
    gpu_s: f64,
    cpu_s: f64,
}

/// The CLI graft's arithmetic on bytes (methods/delta.rs): decode, scaled
/// delta, `add_scaled_delta`, round once.
fn cpu_graft(t: &[u8], i: &[u8], b: &[u8], scale: f32, dtype: ElemDtype) -> Vec<u8> {
    let mut theta = decode(dtype, t);
    let mut d = decode(dtype, i);
    for (d, b) in d.iter_mut().zip(decode(dtype, b)) {
        *d = scale * (*d - b);
    }
    add_scaled_delta(&mut theta, &d);
    encode(dtype, &theta)
}

/// The linear merge's loop (methods/merge.rs) on bytes.
fn cpu_weighted_sum(inputs: &[&[u8]], w: &[f32], dtype: ElemDtype) -> Vec<u8> {
    moe_kernels::reference::weighted_sum(inputs, w, dtype)
}

fn elementwise(gpu: &Gpu, a: &KernelBenchArgs, dtype: ElemDtype) -> anyhow::Result<Vec<Row>> {
    let n = a.rows * a.cols;
    let t = encode(dtype, &values(n, 1));
    let i = encode(dtype, &values(n, 2));
    let b = encode(dtype, &values(n, 3));
    let bytes = |tensors: usize| (tensors * n * dtype.size_bytes()) as f64;
    let shape = format!("{}x{} {}", a.rows, a.cols, dtype.name());

    let gpu_s = time(a.repeat, || Ok(block_on(gpu.graft(&t, &i, &b, 1.0, dtype))?))?;
    let cpu_s = time(a.repeat, || Ok(cpu_graft(&t, &i, &b, 1.0, dtype)))?;
    let same = block_on(gpu.graft(&t, &i, &b, 1.0, dtype))? == cpu_graft(&t, &i, &b, 1.0, dtype);
    anyhow::ensure!(same, "graft {shape}: the GPU result differs from the CPU path");
    let mut rows = vec![Row {
        name: format!("graft {shape}"),
        unit: "GB/s",
        gpu: bytes(4) / gpu_s / 1e9,
        cpu: bytes(4) / cpu_s / 1e9,
        gpu_s,
        cpu_s,
    }];

    let w = [0.5f32, 0.3, 0.2];
    let gpu_s = time(a.repeat, || Ok(block_on(gpu.weighted_sum(&[&t, &i, &b], &w, dtype))?))?;
    let cpu_s = time(a.repeat, || Ok(cpu_weighted_sum(&[&t, &i, &b], &w, dtype)))?;
    rows.push(Row {
        name: format!("weighted sum of 3, {shape}"),
        unit: "GB/s",
        gpu: bytes(4) / gpu_s / 1e9,
        cpu: bytes(4) / cpu_s / 1e9,
        gpu_s,
        cpu_s,
    });
    Ok(rows)
}

fn gram(gpu: &Gpu, a: &KernelBenchArgs) -> anyhow::Result<Row> {
    let (d, n, e) = (a.dim, a.tokens, a.experts.max(1));
    let p = d + 1;
    let h = values(n * d, 7);
    // GPU rows: [x, 1] and the one-hot of expert r % e.
    let mut x = Vec::with_capacity(n * p);
    let mut y = vec![0f32; n * e];
    for r in 0..n {
        x.extend_from_slice(&h[r * d..(r + 1) * d]);
        x.push(1.0);
        y[r * e + r % e] = 1.0;
    }
    // CPU rows grouped by expert, as `route` feeds RidgeStats.
    let groups: Vec<Vec<f32>> =
        (0..e).map(|k| (k..n).step_by(e).flat_map(|r| h[r * d..(r + 1) * d].iter().copied()).collect()).collect();
    let gpu_s = time(a.repeat, || {
        let mut acc = gpu.gram(p, e)?;
        acc.add(&x, &y)?;
        Ok(block_on(acc.read())?)
    })?;
    let cpu_s = time(a.repeat, || {
        let mut s = RidgeStats::new(d, e, true);
        for (k, g) in groups.iter().enumerate() {
            s.accumulate(g, k)?;
        }
        Ok(s)
    })?;
    let flops = 2.0 * n as f64 * p as f64 * (p + e) as f64;
    Ok(Row {
        name: format!("gram n={n} p={p} e={e}"),
        unit: "GFLOP/s",
        gpu: flops / gpu_s / 1e9,
        cpu: flops / cpu_s / 1e9,
        gpu_s,
        cpu_s,
    })
}

/// Runs `bench kernels`.
///
/// # Errors
/// No wgpu adapter (with the install hint), or a kernel error.
pub fn run(a: KernelBenchArgs) -> anyhow::Result<()> {
    let gpu = Gpu::new_blocking().context("bench kernels needs a wgpu adapter")?;
    let mut rows = Vec::new();
    for dtype in [ElemDtype::F32, ElemDtype::Bf16] {
        rows.extend(elementwise(&gpu, &a, dtype)?);
    }
    rows.push(gram(&gpu, &a)?);
    if a.json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"name": r.name, "unit": r.unit, "wgsl": r.gpu, "cpu": r.cpu,
                    "ratio": r.gpu / r.cpu, "wgsl_seconds": r.gpu_s, "cpu_seconds": r.cpu_s})
            })
            .collect();
        println!("{}", serde_json::json!({"adapter": gpu.describe(), "results": list}));
    } else {
        println!("WGSL kernels on {} vs the CLI's CPU path (median of {}):", gpu.describe(), a.repeat.max(1));
        for r in &rows {
            println!(
                "  {:<32} wgsl {:>8.2} {:<7} ({:>7.1} ms)   cpu {:>8.2} {:<7} ({:>7.1} ms)   wgsl/cpu {:.2}",
                r.name,
                r.gpu,
                r.unit,
                r.gpu_s * 1e3,
                r.cpu,
                r.unit,
                r.cpu_s * 1e3,
                r.gpu / r.cpu
            );
        }
    }
    Ok(())
}
