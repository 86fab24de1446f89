//! WGSL compute shaders for moe-studio, with CPU references and a small
//! wgpu runner that works natively (Vulkan; lavapipe from
//! `mesa-vulkan-drivers` on CPU-only machines) and in the browser (WebGPU).
//!
//! - [`Gpu`] opens an adapter and device and runs the elementwise merges
//!   ([`Gpu::weighted_sum`], [`Gpu::delta`], [`Gpu::graft`]) over f32, f16
//!   and bf16 tensors given as little-endian bytes ([`ElemDtype`]).
//! - [`GramAccumulator`] keeps the ridge router's `A = Σ x xᵀ` and
//!   `B = Σ x yᵀ` (DUME, methods.md §2) on the GPU and adds batches of rows.
//! - [`reference`] holds the CPU ground truth the tests compare against.
//!
//! Every kernel is one `.wgsl` file under `wgsl/` (listed in [`ALL`]); the
//! 16-bit kernels are one body (`*_packed16.wgsl`) behind a codec file
//! (`codec_f16.wgsl` / `codec_bf16.wgsl`) that decodes and rounds with bit
//! operations, so no `shader-f16` feature is needed.
//!
//! All runner calls are `async` (buffer readback is asynchronous in
//! WebGPU). Natively, block on them with [`block_on`]. Tensors larger than
//! the device's `max_storage_buffer_binding_size` are processed in chunks.
//! This crate depends on nothing of ours and compiles for native and
//! `wasm32-unknown-unknown` targets.

mod elementwise;
mod gpu;
mod gram;
pub mod reference;

pub use gpu::{ElemDtype, Gpu, KernelError, Result};
pub use gram::GramAccumulator;

/// Blocks the current thread on a runner future (native only; in the
/// browser, `.await` it instead). `pollster::block_on`.
#[cfg(not(target_arch = "wasm32"))]
pub use pollster::block_on;

/// A WGSL kernel: its name, entry point, workgroup size and source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// File stem of the kernel body under `wgsl/`, with the dtype for the
    /// packed 16-bit kernels (`graft_f16` = `codec_f16.wgsl` +
    /// `graft_packed16.wgsl`).
    pub name: &'static str,
    /// Compute entry point.
    pub entry: &'static str,
    /// Workgroup size `[x, y]` (`y = 1` for the 1-D kernels).
    pub workgroup_size: [u32; 2],
    /// WGSL source (codec prepended for the 16-bit kernels).
    pub source: &'static str,
}

/// `out = target + scale * (instruct - base)` over f32, keeping `target`
/// where `scale * (instruct - base)` is exactly 0 (DeltaMoE graft,
/// methods.md §1 phase 2). Bindings: 0 target, 1 instruct, 2 base, 3 out,
/// 4 uniform `{len: u32, _: u32, scale: f32, _: u32}`.
pub const GRAFT_F32: Kernel = Kernel {
    name: "graft_f32",
    entry: "main",
    workgroup_size: [256, 1],
    source: include_str!("../wgsl/graft_f32.wgsl"),
};

/// [`GRAFT_F32`] over f16 packed two per u32, rounded once to f16.
pub const GRAFT_F16: Kernel = Kernel {
    name: "graft_f16",
    entry: "main",
    workgroup_size: [256, 1],
    source: concat!(include_str!("../wgsl/codec_f16.wgsl"), include_str!("../wgsl/graft_packed16.wgsl")),
};

/// [`GRAFT_F32`] over bf16 packed two per u32, rounded once to bf16.
pub const GRAFT_BF16: Kernel = Kernel {
    name: "graft_bf16",
    entry: "main",
    workgroup_size: [256, 1],
    source: concat!(include_str!("../wgsl/codec_bf16.wgsl"), include_str!("../wgsl/graft_packed16.wgsl")),
};

/// One term `acc += x * weight` of a weighted sum over f32 (dispatched once
/// per input). Bindings: 0 x, 1 acc (f32), 2 out, 3 uniform
/// `{len: u32, flags: u32 (1 first, 2 last), weight: f32, _: u32}`.
pub const WEIGHTED_SUM_F32: Kernel = Kernel {
    name: "weighted_sum_f32",
    entry: "main",
    workgroup_size: [256, 1],
    source: include_str!("../wgsl/weighted_sum_f32.wgsl"),
};

/// [`WEIGHTED_SUM_F32`] over f16 packed two per u32 (f32 accumulator).
pub const WEIGHTED_SUM_F16: Kernel = Kernel {
    name: "weighted_sum_f16",
    entry: "main",
    workgroup_size: [256, 1],
    source: concat!(include_str!("../wgsl/codec_f16.wgsl"), include_str!("../wgsl/weighted_sum_packed16.wgsl")),
};

/// [`WEIGHTED_SUM_F32`] over bf16 packed two per u32 (f32 accumulator).
pub const WEIGHTED_SUM_BF16: Kernel = Kernel {
    name: "weighted_sum_bf16",
    entry: "main",
    workgroup_size: [256, 1],
    source: concat!(include_str!("../wgsl/codec_bf16.wgsl"), include_str!("../wgsl/weighted_sum_packed16.wgsl")),
};

/// `C[m, ncols] += Lᵀ R` with `L` `[n, m]` and `R` `[n, ncols]` row-major,
/// f32, 64x64 output tiles of 8x8 invocations (ridge statistics, methods.md §2). Bindings:
/// 0 L, 1 R, 2 C, 3 uniform `{n, m, ncols, _: u32}`.
pub const GRAM_F32: Kernel =
    Kernel { name: "gram_f32", entry: "main", workgroup_size: [8, 8], source: include_str!("../wgsl/gram_f32.wgsl") };

/// Every kernel of the crate.
pub const ALL: &[Kernel] =
    &[GRAFT_F32, GRAFT_F16, GRAFT_BF16, WEIGHTED_SUM_F32, WEIGHTED_SUM_F16, WEIGHTED_SUM_BF16, GRAM_F32];

/// Workgroup counts `(x, y)` of a 2-D dispatch covering `len` invocations
/// with `workgroup_size` threads per group and at most `max_per_dim`
/// groups per dimension (WebGPU's default limit is 65535).
pub fn dispatch_2d(len: usize, workgroup_size: u32, max_per_dim: u32) -> (u32, u32) {
    let groups = len.div_ceil(workgroup_size as usize).max(1);
    let x = groups.min(max_per_dim as usize);
    let y = groups.div_ceil(x);
    (x as u32, y as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_covers_every_element_within_limits() {
        for len in [1usize, 255, 256, 257, 65535 * 256, 65535 * 256 + 1, 100_000_000] {
            let (x, y) = dispatch_2d(len, 256, 65535);
            assert!(x <= 65535 && y <= 65535);
            assert!(x as usize * y as usize * 256 >= len, "len {len}");
            // No whole spare row of workgroups.
            assert!(((y - 1) as usize * x as usize) * 256 < len.max(1));
        }
    }

    #[test]
    fn kernels_declare_their_entry_point_and_workgroup_size() {
        for k in ALL {
            assert!(k.source.contains(&format!("fn {}(", k.entry)), "{}", k.name);
            let ws = match k.workgroup_size {
                [x, 1] => format!("@workgroup_size({x})"),
                [x, y] => format!("@workgroup_size({x}, {y})"),
            };
            assert!(k.source.contains(&ws), "{}", k.name);
        }
    }

    #[test]
    fn every_kernel_parses_and_validates_with_naga() {
        // The shader compiler wgpu runs natively: catches WGSL errors (and a
        // codec and body defining one name twice) without a GPU.
        for k in ALL {
            let module = naga::front::wgsl::parse_str(k.source)
                .unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(k.source)));
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
        }
    }
}
