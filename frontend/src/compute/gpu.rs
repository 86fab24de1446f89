//! Where the WGSL kernels (crate `moe-studio-kernels`) plug in.
//!
//! When the browser grants a WebGPU adapter, [`init`] opens a kernels
//! [`Gpu`] once; the graft's elementwise `target + scale * (instruct -
//! base)` then runs on it ([`super::graft`]), bit-identical to the CPU
//! path (same f32 operations in the same order; checked end to end against
//! the CLI's sha256), and so do MoErge's averages of two models' shared
//! tensors ([`super::moerge`]: `0.5 a + 0.5 b` in f32 equals the CLI's f64
//! mean; three or more models or differing shapes stay on the CPU, where
//! only the f64 accumulator gives the CLI's bits). The router page's
//! "averaging" baseline ([`super::average`]) is read inside a synchronous
//! tensor source for the CPU forward pass and stays there too. Without
//! WebGPU every method runs the shared CPU code
//! and the pages say so ([`Engine::describe`]). The ridge Gram statistics
//! run on the kernel when the router page's box is ticked (f32 blocks
//! summed in f64 on the CPU: the routers of the MoErged stories260K were
//! within 3.2e-5 of the CLI's in the e2e run), else on the CPU in f64, the
//! CLI's own path (routers within 1e-5).
//!
//! The worker opens the device in the background when it starts, with a
//! timeout (`worker::host::GPU_TIMEOUT_MS`); until then every method runs on
//! the CPU ([`gpu`] is `None`).

use std::cell::RefCell;
use std::rc::Rc;

use moe_kernels::Gpu;

use crate::web::GpuStatus;

thread_local! {
    static GPU: RefCell<Option<Rc<Gpu>>> = const { RefCell::new(None) };
}

/// Opens the kernels' device on the granted adapter (once).
///
/// # Errors
/// The runner's message when the device cannot be opened.
pub async fn init() -> Result<String, String> {
    if let Some(g) = gpu() {
        return Ok(g.describe());
    }
    let g = Gpu::new().await.map_err(|e| e.to_string())?;
    let d = g.describe();
    GPU.with(|c| *c.borrow_mut() = Some(Rc::new(g)));
    Ok(d)
}

/// The kernels' device, when [`init`] succeeded.
pub fn gpu() -> Option<Rc<Gpu>> {
    GPU.with(|c| c.borrow().clone())
}

/// The compute path of the elementwise steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// WGSL kernels on WebGPU.
    WebGpu,
    /// The shared CPU code (wasm, single thread).
    Cpu,
}

impl Engine {
    /// WebGPU when the worker opened the kernels' device (the status the
    /// page got from it), else the CPU.
    pub fn choose(gpu_status: &GpuStatus) -> Engine {
        match gpu_status {
            GpuStatus::Available(_) => Engine::WebGpu,
            _ => Engine::Cpu,
        }
    }

    /// A sentence for the page.
    pub fn describe(self, gpu_status: &GpuStatus) -> String {
        match (self, gpu_status) {
            (Engine::WebGpu, GpuStatus::Available(a)) => format!(
                "graft, MoErge averages and the ridge router's Gram statistics on WebGPU ({a}); model forward passes on the CPU, in the studio's worker"
            ),
            (_, GpuStatus::Available(a)) => {
                format!("CPU in this tab (WebGPU adapter {a} found but the kernels could not start)")
            }
            (_, GpuStatus::Missing(why)) => format!("CPU fallback: WebGPU is not available ({why})"),
            (_, GpuStatus::Unknown) => {
                "CPU in the studio's worker (WebGPU is still being checked; the kernels are used once it answers)".into()
            }
        }
    }
}
