//! Elementwise merges on the GPU: weighted sum of N tensors, delta and
//! graft (methods.md §1 phase 2; the linear merge of merge.rs), over f32,
//! f16 and bf16 stored as little-endian bytes.
//!
//! # Numerics
//! Values are decoded exactly to f32, combined with f32 operations in the
//! same order as the CPU code (`shared/src/methods/delta.rs`,
//! `shared/src/methods/merge.rs`, and [`crate::reference`]), and rounded once
//! to the storage dtype, round-to-nearest-even exactly as the `half` crate.
//! The results are bit-identical to the CPU path on IEEE-conforming
//! devices (lavapipe: tested). Two things WGSL leaves to the device can
//! differ: a driver may fuse `a + x * w` into one fused multiply-add (one
//! rounding fewer), and f32 subnormal inputs or results may be flushed to
//! zero; NaN payloads are not preserved through arithmetic.

use crate::gpu::{read_back, write_padded, ElemDtype, Gpu, KernelError, Result};
use crate::{dispatch_2d, Kernel};

impl Gpu {
    /// `out = Σ_k weights[k] * inputs[k]`, elementwise: accumulated in f32
    /// as `((0 + x_0 w_0) + x_1 w_1) + ...` (the CPU linear merge, merge.rs)
    /// and rounded once to `dtype`.
    ///
    /// `inputs` are tensors of one length in `dtype`'s little-endian bytes;
    /// the output has that length. Tensors larger than one storage binding
    /// are processed in chunks.
    ///
    /// # Errors
    /// [`KernelError::Invalid`] for no inputs, a weight count that differs
    /// from the input count, inputs of different lengths or a length that is
    /// not whole elements; [`KernelError::Gpu`] for device errors.
    pub async fn weighted_sum(&self, inputs: &[&[u8]], weights: &[f32], dtype: ElemDtype) -> Result<Vec<u8>> {
        if inputs.is_empty() {
            return Err(KernelError::Invalid("weighted_sum: no input tensors".into()));
        }
        if weights.len() != inputs.len() {
            return Err(KernelError::Invalid(format!(
                "weighted_sum: {} weights for {} tensors: give one weight per tensor",
                weights.len(),
                inputs.len()
            )));
        }
        let n = elements("weighted_sum", inputs, dtype)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.scoped(self.weighted_sum_chunks(inputs, weights, dtype, n)).await
    }

    /// `instruct - base`, elementwise (the alignment delta, methods.md §1
    /// phase 2): [`Gpu::weighted_sum`] with weights `[1, -1]`. Bit-identical
    /// to `instruct - base` in f32 except that `-0.0 - 0.0` gives `+0.0`.
    ///
    /// # Errors
    /// As [`Gpu::weighted_sum`].
    pub async fn delta(&self, instruct: &[u8], base: &[u8], dtype: ElemDtype) -> Result<Vec<u8>> {
        self.weighted_sum(&[instruct, base], &[1.0, -1.0], dtype).await
    }

    /// DeltaMoE graft (methods.md §1 phase 2), elementwise:
    /// `sd = scale * (instruct - base)`, `out = target + sd`, keeping
    /// `target` bit for bit where `sd == 0` - the CLI graft's arithmetic
    /// (`shared/src/methods/delta.rs`), in f32, rounded once to `dtype`.
    ///
    /// All three tensors are `dtype` bytes of one length (convert mixed
    /// dtypes before calling).
    ///
    /// # Errors
    /// [`KernelError::Invalid`] for tensors of different lengths or a
    /// length that is not whole elements; [`KernelError::Gpu`] for device
    /// errors.
    pub async fn graft(
        &self,
        target: &[u8],
        instruct: &[u8],
        base: &[u8],
        scale: f32,
        dtype: ElemDtype,
    ) -> Result<Vec<u8>> {
        let n = elements("graft", &[target, instruct, base], dtype)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.scoped(self.graft_chunks([target, instruct, base], scale, dtype, n)).await
    }

    /// Elements per chunk when one element takes `bytes_per_elem` bytes in
    /// the widest binding (even, so 16-bit chunks start on a word).
    fn chunk_elems(&self, bytes_per_elem: usize) -> usize {
        ((self.max_binding_bytes as usize / bytes_per_elem) & !1).max(2)
    }

    fn dispatch(
        &self,
        enc: &mut wgpu::CommandEncoder,
        pipe: &wgpu::ComputePipeline,
        bg: &wgpu::BindGroup,
        invocations: usize,
    ) -> Result<()> {
        let (x, y) = dispatch_2d(invocations, 256, self.max_groups_per_dim);
        if y > self.max_groups_per_dim {
            return Err(KernelError::TooLarge(format!(
                "{invocations} invocations need {x}x{y} workgroups, over the device's {} per dimension",
                self.max_groups_per_dim
            )));
        }
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, bg, &[]);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }

    async fn weighted_sum_chunks(
        &self,
        inputs: &[&[u8]],
        weights: &[f32],
        dtype: ElemDtype,
        n: usize,
    ) -> Result<Vec<u8>> {
        let kernel = match dtype {
            ElemDtype::F32 => crate::WEIGHTED_SUM_F32,
            ElemDtype::F16 => crate::WEIGHTED_SUM_F16,
            ElemDtype::Bf16 => crate::WEIGHTED_SUM_BF16,
        };
        let size = dtype.size_bytes();
        // The f32 accumulator is the widest binding.
        let chunk = self.chunk_elems(4).min(n);
        let pipe = self.pipeline(&kernel);
        let x = self.storage("x", (chunk * size) as u64, false);
        let acc = self.storage("acc", (chunk.next_multiple_of(2) * 4) as u64, false);
        let out = self.storage("out", (chunk * size) as u64, true);
        let staging = self.staging((chunk * size) as u64);
        let params = self.uniform(&[0; 4]);
        let bg = bind_group(&self.device, &pipe, &[&x, &acc, &out, &params]);
        let mut result = Vec::with_capacity(n * size);
        let last = inputs.len() - 1;
        for start in (0..n).step_by(chunk) {
            let m = chunk.min(n - start);
            let bytes = start * size..(start + m) * size;
            for (k, (input, w)) in inputs.iter().zip(weights).enumerate() {
                write_padded(&self.queue, &x, 0, &input[bytes.clone()]);
                let flags = u32::from(k == 0) | (u32::from(k == last) << 1);
                self.queue.write_buffer(&params, 0, bytemuck::cast_slice(&[m as u32, flags, w.to_bits(), 0]));
                let mut enc = self.device.create_command_encoder(&Default::default());
                self.dispatch(&mut enc, &pipe, &bg, invocations(m, dtype))?;
                if k == last {
                    enc.copy_buffer_to_buffer(&out, 0, &staging, 0, ((m * size).next_multiple_of(4)) as u64);
                }
                self.queue.submit([enc.finish()]);
            }
            result.extend(read_back(&self.device, &staging, (m * size) as u64).await?);
        }
        Ok(result)
    }

    async fn graft_chunks(&self, tensors: [&[u8]; 3], scale: f32, dtype: ElemDtype, n: usize) -> Result<Vec<u8>> {
        let kernel = graft_kernel(dtype);
        let size = dtype.size_bytes();
        let chunk = self.chunk_elems(size).min(n);
        let pipe = self.pipeline(&kernel);
        let bufs: Vec<wgpu::Buffer> =
            ["target", "instruct", "base"].iter().map(|l| self.storage(l, (chunk * size) as u64, false)).collect();
        let out = self.storage("out", (chunk * size) as u64, true);
        let staging = self.staging((chunk * size) as u64);
        let params = self.uniform(&[0; 4]);
        let bg = bind_group(&self.device, &pipe, &[&bufs[0], &bufs[1], &bufs[2], &out, &params]);
        let mut result = Vec::with_capacity(n * size);
        for start in (0..n).step_by(chunk) {
            let m = chunk.min(n - start);
            let bytes = start * size..(start + m) * size;
            for (buf, t) in bufs.iter().zip(tensors) {
                write_padded(&self.queue, buf, 0, &t[bytes.clone()]);
            }
            self.queue.write_buffer(&params, 0, bytemuck::cast_slice(&[m as u32, 0, scale.to_bits(), 0]));
            let mut enc = self.device.create_command_encoder(&Default::default());
            self.dispatch(&mut enc, &pipe, &bg, invocations(m, dtype))?;
            enc.copy_buffer_to_buffer(&out, 0, &staging, 0, ((m * size).next_multiple_of(4)) as u64);
            self.queue.submit([enc.finish()]);
            result.extend(read_back(&self.device, &staging, (m * size) as u64).await?);
        }
        Ok(result)
    }
}

fn graft_kernel(dtype: ElemDtype) -> Kernel {
    match dtype {
        ElemDtype::F32 => crate::GRAFT_F32,
        ElemDtype::F16 => crate::GRAFT_F16,
        ElemDtype::Bf16 => crate::GRAFT_BF16,
    }
}

/// One invocation per f32 element, or per u32 word of two 16-bit elements.
fn invocations(elems: usize, dtype: ElemDtype) -> usize {
    match dtype {
        ElemDtype::F32 => elems,
        ElemDtype::F16 | ElemDtype::Bf16 => elems.div_ceil(2),
    }
}

/// The common element count of `tensors`.
fn elements(op: &str, tensors: &[&[u8]], dtype: ElemDtype) -> Result<usize> {
    let len = tensors[0].len();
    if let Some((k, t)) = tensors.iter().enumerate().find(|(_, t)| t.len() != len) {
        return Err(KernelError::Invalid(format!(
            "{op}: tensor {k} has {} bytes but tensor 0 has {len}: the tensors must have one shape",
            t.len()
        )));
    }
    if !len.is_multiple_of(dtype.size_bytes()) {
        return Err(KernelError::Invalid(format!("{op}: {len} bytes are not whole {} elements", dtype.name())));
    }
    Ok(len / dtype.size_bytes())
}

/// A bind group of whole buffers at bindings `0..buffers.len()`.
pub(crate) fn bind_group(
    device: &wgpu::Device,
    pipe: &wgpu::ComputePipeline,
    buffers: &[&wgpu::Buffer],
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipe.get_bind_group_layout(0),
        entries: &entries,
    })
}
