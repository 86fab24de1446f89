//! WGSL compute shaders for moe-studio, one kernel per file under `wgsl/`,
//! each with a CPU reference in [`reference`] that tests compare against.
//!
//! The wgpu runner (native Vulkan / lavapipe and browser WebGPU) arrives with
//! the browser studio; this crate depends on nothing of ours and compiles
//! for native and `wasm32-unknown-unknown` targets.

pub mod reference;

/// A WGSL kernel: its name, entry point and source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// File stem under `wgsl/`.
    pub name: &'static str,
    /// Compute entry point.
    pub entry: &'static str,
    /// Workgroup size along x.
    pub workgroup_size: u32,
    /// WGSL source.
    pub source: &'static str,
}

/// `out = target + scale * (instruct - base)` over f32 (DeltaMoE graft,
/// methods.md §1 phase 2). Bindings: 0 target, 1 instruct, 2 base, 3 out,
/// 4 uniform `{len: u32, offset: u32, scale: f32, _pad: u32}`.
pub const GRAFT_F32: Kernel =
    Kernel { name: "graft_f32", entry: "main", workgroup_size: 256, source: include_str!("../wgsl/graft_f32.wgsl") };

/// Every kernel of the crate.
pub const ALL: &[Kernel] = &[GRAFT_F32];

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
            assert!(k.source.contains(&format!("@workgroup_size({})", k.workgroup_size)), "{}", k.name);
        }
    }
}
