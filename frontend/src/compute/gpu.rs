//! Where the WGSL kernels (crate `moe-studio-kernels`) plug in.
//!
//! The elementwise graft / weighted sum and the ridge Gram accumulation are
//! meant to run on WebGPU through the kernels' runner when an adapter is
//! granted. Until that runner lands, every method runs the shared CPU code
//! (the same functions as the CLI), and the page says so: [`Engine`]
//! reports which path a step used.

use crate::web::GpuStatus;

/// The compute path of the elementwise and Gram steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// WGSL kernels on WebGPU.
    WebGpu,
    /// The shared CPU code (wasm, single thread).
    Cpu,
}

impl Engine {
    /// The engine for this browser: WebGPU kernels are not wired yet, so
    /// the CPU path is used whatever the adapter.
    pub fn choose(_gpu: &GpuStatus) -> Engine {
        Engine::Cpu
    }

    /// A sentence for the page.
    pub fn describe(self, gpu: &GpuStatus) -> String {
        match (self, gpu) {
            (Engine::WebGpu, GpuStatus::Available(a)) => format!("WebGPU kernels on {a}"),
            (_, GpuStatus::Available(a)) => {
                format!(
                    "CPU in this tab (WebGPU adapter found: {a}; the WGSL kernels are not wired into this step yet)"
                )
            }
            (_, GpuStatus::Missing(why)) => format!("CPU fallback: WebGPU is not available ({why})"),
            (_, GpuStatus::Unknown) => "CPU in this tab".into(),
        }
    }
}
