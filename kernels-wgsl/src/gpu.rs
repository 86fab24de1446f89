//! The device handle: adapter and device, limits, pipeline cache, buffer
//! helpers and asynchronous readback shared by the kernels.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use wgpu::util::DeviceExt;

use crate::Kernel;

/// Errors of the runner.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No adapter could be found (`hint` says what to install or enable).
    #[error("no WebGPU/Vulkan adapter: {hint} ({detail})")]
    NoAdapter {
        /// What to do about it.
        hint: &'static str,
        /// wgpu's message.
        detail: String,
    },
    /// The adapter refused to open a device.
    #[error("could not open a device on adapter {adapter}: {detail}")]
    Device {
        /// Adapter name.
        adapter: String,
        /// wgpu's message.
        detail: String,
    },
    /// Inputs of the wrong length, shape or count (nothing was run).
    #[error("{0}")]
    Invalid(String),
    /// A tensor or matrix that cannot be split to fit the device's limits.
    #[error("{0}")]
    TooLarge(String),
    /// wgpu reported a validation or out-of-memory error, or a readback failed.
    #[error("GPU error: {0}")]
    Gpu(String),
}

/// Result of the runner.
pub type Result<T> = std::result::Result<T, KernelError>;

/// Storage dtype of an elementwise tensor: little-endian bytes, f16 and
/// bf16 packed two per 32-bit word on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemDtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the high half of an f32).
    Bf16,
}

impl ElemDtype {
    /// Bytes per element (4 or 2).
    pub fn size_bytes(self) -> usize {
        match self {
            ElemDtype::F32 => 4,
            ElemDtype::F16 | ElemDtype::Bf16 => 2,
        }
    }

    /// Lower-case name (`"f32"`, `"f16"`, `"bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            ElemDtype::F32 => "f32",
            ElemDtype::F16 => "f16",
            ElemDtype::Bf16 => "bf16",
        }
    }
}

/// A GPU (adapter + device + queue) with the limits the runner splits work
/// under, and the compiled pipelines.
///
/// Natively: Vulkan (on CPU-only Linux, lavapipe from
/// `mesa-vulkan-drivers`). In the browser: WebGPU.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    /// Bytes one storage binding may span (the device's
    /// `max_storage_buffer_binding_size`, or a smaller override).
    pub(crate) max_binding_bytes: u64,
    /// `max_compute_workgroups_per_dimension`.
    pub(crate) max_groups_per_dim: u32,
    pipelines: Mutex<HashMap<&'static str, wgpu::ComputePipeline>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(not(target_arch = "wasm32"))]
const NO_ADAPTER_HINT: &str = "install mesa-vulkan-drivers (lavapipe) and libvulkan1, or a GPU driver with Vulkan";
#[cfg(target_arch = "wasm32")]
const NO_ADAPTER_HINT: &str = "WebGPU unavailable in this browser (enable it, or use a browser that has it)";

impl Gpu {
    /// Opens the first adapter wgpu offers (high-performance preference)
    /// and a device with that adapter's own limits.
    ///
    /// # Errors
    /// [`KernelError::NoAdapter`] when there is none (natively: install
    /// `mesa-vulkan-drivers` for lavapipe; in the browser: WebGPU
    /// unavailable), [`KernelError::Device`] when the device cannot be opened.
    pub async fn new() -> Result<Gpu> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| KernelError::NoAdapter { hint: NO_ADAPTER_HINT, detail: e.to_string() })?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("moe-kernels"),
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| KernelError::Device { adapter: info.name.clone(), detail: e.to_string() })?;
        let max_binding_bytes = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        Ok(Gpu {
            device,
            queue,
            info,
            max_binding_bytes,
            max_groups_per_dim: limits.max_compute_workgroups_per_dimension,
            pipelines: Mutex::new(HashMap::new()),
        })
    }

    /// [`Gpu::new`], blocking (native only).
    ///
    /// # Errors
    /// As [`Gpu::new`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking() -> Result<Gpu> {
        pollster::block_on(Gpu::new())
    }

    /// Lowers the bytes one storage binding may span (clamped to
    /// `[256, device limit]`, rounded down to a multiple of 4), so that tests
    /// exercise the chunked path on small tensors.
    pub fn with_max_binding_bytes(mut self, bytes: u64) -> Gpu {
        self.max_binding_bytes = bytes.clamp(256, self.max_binding_bytes) & !3;
        self
    }

    /// Bytes one storage binding may span (the split size of large tensors).
    pub fn max_binding_bytes(&self) -> u64 {
        self.max_binding_bytes
    }

    /// Adapter name and backend, e.g. `"llvmpipe (LLVM 15.0.6, 256 bits)
    /// (Vulkan, Cpu; max binding 128 MiB)"`.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}; max binding {} MiB)",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.max_binding_bytes >> 20
        )
    }

    /// Whether the adapter is a CPU implementation (lavapipe, SwiftShader).
    pub fn is_cpu(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The compute pipeline of `kernel`, compiled on first use.
    pub(crate) fn pipeline(&self, kernel: &Kernel) -> wgpu::ComputePipeline {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(kernel.name)
            .or_insert_with(|| {
                let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(kernel.name),
                    source: wgpu::ShaderSource::Wgsl(kernel.source.into()),
                });
                self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(kernel.name),
                    layout: None,
                    module: &module,
                    entry_point: Some(kernel.entry),
                    compilation_options: Default::default(),
                    cache: None,
                })
            })
            .clone()
    }

    /// A storage buffer of `bytes` (rounded up to 4).
    pub(crate) fn storage(&self, label: &str, bytes: u64, copy_src: bool) -> wgpu::Buffer {
        let mut usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        if copy_src {
            usage |= wgpu::BufferUsages::COPY_SRC;
        }
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(4).next_multiple_of(4),
            usage,
            mapped_at_creation: false,
        })
    }

    /// A mappable buffer that results are copied into.
    pub(crate) fn staging(&self, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A uniform buffer holding `words`.
    pub(crate) fn uniform(&self, words: &[u32; 4]) -> wgpu::Buffer {
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::cast_slice(words),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// Runs `f` inside validation and out-of-memory error scopes (see
    /// [`scoped`]).
    pub(crate) async fn scoped<T>(&self, f: impl Future<Output = Result<T>>) -> Result<T> {
        scoped(&self.device, f).await
    }
}

/// Runs `f` inside validation and out-of-memory error scopes of `device`
/// and turns anything wgpu reports into [`KernelError::Gpu`].
pub(crate) async fn scoped<T>(device: &wgpu::Device, f: impl Future<Output = Result<T>>) -> Result<T> {
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let r = f.await;
    let v = validation.pop().await;
    let o = oom.pop().await;
    match v.or(o) {
        Some(e) => Err(KernelError::Gpu(e.to_string())),
        None => r,
    }
}

/// Copies the first `bytes` of `staging` (already filled by submitted work)
/// back to the host.
pub(crate) async fn read_back(device: &wgpu::Device, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
    let padded = bytes.max(4).next_multiple_of(4);
    let slice = staging.slice(..padded);
    let (tx, rx) = oneshot();
    slice.map_async(wgpu::MapMode::Read, tx);
    // Natively the callback runs inside `poll`; in the browser the event
    // loop runs it and `rx` wakes the awaiting task.
    #[cfg(not(target_arch = "wasm32"))]
    device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| KernelError::Gpu(e.to_string()))?;
    #[cfg(target_arch = "wasm32")]
    let _ = device;
    rx.await.map_err(|e| KernelError::Gpu(format!("reading results back: {e}")))?;
    let mut out = slice.get_mapped_range().to_vec();
    staging.unmap();
    out.truncate(bytes as usize);
    Ok(out)
}

/// Writes `bytes` at `offset` of `buffer`, zero-padded to a multiple of 4
/// (wgpu's copy alignment).
pub(crate) fn write_padded(queue: &wgpu::Queue, buffer: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
    if bytes.len().is_multiple_of(4) {
        queue.write_buffer(buffer, offset, bytes);
    } else {
        let mut v = bytes.to_vec();
        v.resize(bytes.len().next_multiple_of(4), 0);
        queue.write_buffer(buffer, offset, &v);
    }
}

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

/// The receiving half of [`oneshot`].
struct Receiver<T>(Arc<Mutex<Slot<T>>>);

impl<T> Future for Receiver<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match s.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A one-value channel: the sender is a `Send + 'static` closure (what
/// `map_async` wants), the receiver a future.
fn oneshot<T: Send + 'static>() -> (impl FnOnce(T) + Send + 'static, Receiver<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, waker: None }));
    let tx = {
        let slot = Arc::clone(&slot);
        move |v: T| {
            let waker = {
                let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
                s.value = Some(v);
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    };
    (tx, Receiver(slot))
}
