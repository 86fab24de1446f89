//! Gram accumulation for the ridge router on the GPU (DUME, methods.md §2):
//! `A += Xᵀ X` (`[p, p]`) and `B += Xᵀ Y` (`[p, e]`) over batches of rows,
//! with `A` and `B` kept in GPU memory (f32) between batches.
//!
//! # Feeding `RidgeStats`
//! `shared::methods::ridge::RidgeStats` keeps `A = Σ x xᵀ` and
//! `B = Σ x yᵀ` in f64 with `p = d + 1` when the router has a bias (a
//! constant 1 appended to every `x`) and `y` the one-hot of the token's
//! expert (domain). To compute them here, pass rows `[x, 1]` (`p = d + 1`)
//! and one-hot rows `y` (`e` = number of experts); after [`GramAccumulator::read`],
//! add `A` and `B` (as f64) into the statistics' `a` and `b` and the per-expert
//! row counts into `tokens` (for example through `RidgeStats::merge`).
//!
//! # Numerics
//! Each dispatch sums its chunk of rows (at most 16384) in f32 registers
//! and adds the sums into the f32 `A`/`B`; the CPU reference accumulates in
//! f64. Expect relative errors around `1e-6 · sqrt(rows)` on the largest
//! entries (tests: within `1e-4` of `max |A|`).

use crate::elementwise::bind_group;
use crate::gpu::{read_back, scoped, Gpu, KernelError, Result};

/// Output tile of the Gram kernel (64x64 per workgroup).
const TILE: usize = 64;
/// Most rows staged per dispatch (bounds the staging buffers to
/// `16384 · max(p, e) · 4` bytes).
const MAX_CHUNK_ROWS: usize = 16384;

/// `A = Σ xᵀ x` (`[p, p]`) and `B = Σ xᵀ y` (`[p, e]`), row-major f32,
/// accumulated on the GPU. Made by [`Gpu::gram`].
pub struct GramAccumulator {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipe: wgpu::ComputePipeline,
    a: wgpu::Buffer,
    b: wgpu::Buffer,
    x: wgpu::Buffer,
    y: wgpu::Buffer,
    params_a: wgpu::Buffer,
    params_b: wgpu::Buffer,
    bind_a: wgpu::BindGroup,
    bind_b: wgpu::BindGroup,
    p: usize,
    e: usize,
    chunk_rows: usize,
    rows: u64,
}

impl std::fmt::Debug for GramAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GramAccumulator {{ p: {}, e: {}, rows: {} }}", self.p, self.e, self.rows)
    }
}

impl Gpu {
    /// A zeroed [`GramAccumulator`] for rows of `p` features and `e` targets.
    ///
    /// # Errors
    /// [`KernelError::Invalid`] for `p == 0` or `e == 0`;
    /// [`KernelError::TooLarge`] when `A` (`p²·4` bytes), `B` or one row do
    /// not fit one storage binding, or `p / 64` exceeds the workgroup limit.
    pub fn gram(&self, p: usize, e: usize) -> Result<GramAccumulator> {
        self.gram_chunked(p, e, MAX_CHUNK_ROWS)
    }

    /// [`Gpu::gram`] staging at most `max_chunk_rows` rows per dispatch
    /// (>= 1): smaller staging buffers (`max_chunk_rows · max(p, e) · 4`
    /// bytes) for many accumulators at once, e.g. one per MoE layer in the
    /// browser.
    ///
    /// # Errors
    /// As [`Gpu::gram`].
    pub fn gram_chunked(&self, p: usize, e: usize, max_chunk_rows: usize) -> Result<GramAccumulator> {
        if p == 0 || e == 0 {
            return Err(KernelError::Invalid(format!("gram: p = {p} and e = {e} must both be > 0")));
        }
        let limit = self.max_binding_bytes as usize;
        let widest = p.max(e);
        if p * widest * 4 > limit {
            return Err(KernelError::TooLarge(format!(
                "gram: A/B of {p}x{widest} f32 ({} bytes) exceed the device's storage binding limit of {limit} bytes",
                p * widest * 4
            )));
        }
        if p.div_ceil(TILE) > self.max_groups_per_dim as usize {
            return Err(KernelError::TooLarge(format!(
                "gram: p = {p} needs more than {} workgroups",
                self.max_groups_per_dim
            )));
        }
        let chunk_rows = (limit / (4 * widest)).min(max_chunk_rows.clamp(1, MAX_CHUNK_ROWS));
        let pipe = self.pipeline(&crate::GRAM_F32);
        let a = self.storage("gram A", (p * p * 4) as u64, true);
        let b = self.storage("gram B", (p * e * 4) as u64, true);
        let x = self.storage("gram X", (chunk_rows * p * 4) as u64, false);
        let y = self.storage("gram Y", (chunk_rows * e * 4) as u64, false);
        let params_a = self.uniform(&[0, p as u32, p as u32, 0]);
        let params_b = self.uniform(&[0, p as u32, e as u32, 0]);
        let bind_a = bind_group(&self.device, &pipe, &[&x, &x, &a, &params_a]);
        let bind_b = bind_group(&self.device, &pipe, &[&x, &y, &b, &params_b]);
        Ok(GramAccumulator {
            device: self.device.clone(),
            queue: self.queue.clone(),
            pipe,
            a,
            b,
            x,
            y,
            params_a,
            params_b,
            bind_a,
            bind_b,
            p,
            e,
            chunk_rows,
            rows: 0,
        })
    }
}

impl GramAccumulator {
    /// Features per row `p` (`A` is `[p, p]`).
    pub fn p(&self) -> usize {
        self.p
    }

    /// Targets per row `e` (`B` is `[p, e]`).
    pub fn e(&self) -> usize {
        self.e
    }

    /// Rows added so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Adds `n` rows: `A += xᵀ x`, `B += xᵀ y` with `x` `[n, p]` and `y`
    /// `[n, e]` row-major. The work is queued; [`GramAccumulator::read`]
    /// waits for it. Batches larger than one binding are split by rows.
    ///
    /// # Errors
    /// [`KernelError::Invalid`] when `x` is not whole rows of `p` or `y` is
    /// not `n` rows of `e`. (Device errors during `add` go to wgpu's
    /// uncaptured-error handler, which panics natively.)
    pub fn add(&mut self, x: &[f32], y: &[f32]) -> Result<()> {
        let (p, e) = (self.p, self.e);
        if !x.len().is_multiple_of(p) {
            return Err(KernelError::Invalid(format!("gram: {} values of x are not rows of p = {p}", x.len())));
        }
        let n = x.len() / p;
        if y.len() != n * e {
            return Err(KernelError::Invalid(format!(
                "gram: y has {} values but {n} rows of e = {e} need {}",
                y.len(),
                n * e
            )));
        }
        for start in (0..n).step_by(self.chunk_rows) {
            let m = self.chunk_rows.min(n - start);
            self.queue.write_buffer(&self.x, 0, bytemuck::cast_slice(&x[start * p..(start + m) * p]));
            self.queue.write_buffer(&self.y, 0, bytemuck::cast_slice(&y[start * e..(start + m) * e]));
            self.queue.write_buffer(&self.params_a, 0, bytemuck::cast_slice(&[m as u32]));
            self.queue.write_buffer(&self.params_b, 0, bytemuck::cast_slice(&[m as u32]));
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc
                    .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("gram"), timestamp_writes: None });
                pass.set_pipeline(&self.pipe);
                pass.set_bind_group(0, &self.bind_a, &[]);
                pass.dispatch_workgroups(p.div_ceil(TILE) as u32, p.div_ceil(TILE) as u32, 1);
                pass.set_bind_group(0, &self.bind_b, &[]);
                pass.dispatch_workgroups(p.div_ceil(TILE) as u32, e.div_ceil(TILE) as u32, 1);
            }
            self.queue.submit([enc.finish()]);
        }
        self.rows += n as u64;
        Ok(())
    }

    /// Waits for the queued work and returns `(A, B)`: `A` `[p, p]` and `B`
    /// `[p, e]`, row-major f32.
    ///
    /// # Errors
    /// [`KernelError::Gpu`] when the device reports an error or the readback
    /// fails.
    pub async fn read(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let (pp, pe) = ((self.p * self.p * 4) as u64, (self.p * self.e * 4) as u64);
        scoped(&self.device, async {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gram readback"),
                size: pp + pe,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&self.a, 0, &staging, 0, pp);
            enc.copy_buffer_to_buffer(&self.b, 0, &staging, pp, pe);
            self.queue.submit([enc.finish()]);
            let bytes = read_back(&self.device, &staging, pp + pe).await?;
            let all: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            let (a, b) = all.split_at(self.p * self.p);
            Ok((a.to_vec(), b.to_vec()))
        })
        .await
    }

    /// Zeroes `A`, `B` and the row count.
    pub fn clear(&mut self) {
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&self.a, 0, None);
        enc.clear_buffer(&self.b, 0, None);
        self.queue.submit([enc.finish()]);
        self.rows = 0;
    }
}
