//! Burn backend selection at run time among those compiled in.
//!
//! `auto` (the default) picks, in order: CUDA when built with the `cuda`
//! feature and a CUDA device answers; else wgpu when built with the `wgpu`
//! feature and a hardware adapter exists (a CPU implementation such as
//! lavapipe is skipped: the CPU backend is faster there); else `cpu`
//! ([`moe_shared::CpuBackend`], burn-flex). `ndarray` (the CPU backend's
//! earlier name, which stored job rows carry) and `flex` are accepted as
//! aliases of `cpu`.

use burn::tensor::{backend::Backend, ElementConversion, Tensor};

/// A command generic over the Burn backend.
pub trait WithBackend {
    /// Runs with backend `B` on `device`.
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()>;
}

/// Backends compiled into this binary (`cpu` always; `wgpu`, `cuda`
/// with those cargo features).
pub fn built() -> Vec<&'static str> {
    let mut v = vec!["cpu"];
    if cfg!(feature = "wgpu") {
        v.push("wgpu");
    }
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    v
}

/// Devices backend `name` can use for data parallelism (`train
/// --devices`): the CPU backend has one, the CPU (more "devices" would be replicas
/// of the model on the same cores, each costing its memory); wgpu one, its
/// default adapter; CUDA the GPUs the NVIDIA driver lists
/// (`/proc/driver/nvidia/gpus/*`, else `/dev/nvidiaN`), at least one.
pub fn device_count(name: &str) -> usize {
    match name {
        "cuda" => {
            let gpus = std::fs::read_dir("/proc/driver/nvidia/gpus").map(|rd| rd.flatten().count()).unwrap_or(0);
            let nodes = || {
                std::fs::read_dir("/dev")
                    .map(|rd| {
                        rd.flatten()
                            .filter(|e| {
                                let n = e.file_name().to_string_lossy().into_owned();
                                n.strip_prefix("nvidia")
                                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                            })
                            .count()
                    })
                    .unwrap_or(0)
            };
            if gpus > 0 {
                gpus
            } else {
                nodes().max(1)
            }
        }
        _ => 1,
    }
}

/// A backend name resolved to one that is built and usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `cpu`, `wgpu` or `cuda`.
    pub name: &'static str,
    /// Why `auto` chose it (empty when the name was given).
    pub reason: String,
}

/// Resolves `--backend NAME`: `auto`, `cpu` (aliases `ndarray`, `flex`),
/// `wgpu`, `cuda`.
///
/// # Errors
/// A name that is unknown or not built into this binary (the message lists
/// the built ones).
pub fn resolve(name: &str) -> anyhow::Result<Resolved> {
    let given = |name| Ok(Resolved { name, reason: String::new() });
    match name {
        "auto" => Ok(auto()),
        "cpu" | "ndarray" | "flex" => given("cpu"),
        "wgpu" if cfg!(feature = "wgpu") => given("wgpu"),
        "cuda" if cfg!(feature = "cuda") => given("cuda"),
        other => anyhow::bail!(
            "--backend `{other}`: expected auto, {} (built into this binary; `ndarray` and `flex` name cpu; \
             wgpu and cuda need the cargo features of the same names)",
            built().join(", ")
        ),
    }
}

/// The `auto` choice (see the module doc).
fn auto() -> Resolved {
    #[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(unused_mut))]
    let mut skipped: Vec<String> = Vec::new();
    #[cfg(feature = "cuda")]
    {
        if cuda_device_present() && answers::<burn::backend::Cuda>(Default::default()) {
            return Resolved { name: "cuda", reason: "auto: a CUDA device answered".into() };
        }
        skipped.push("no CUDA device".into());
    }
    #[cfg(feature = "wgpu")]
    {
        match moe_kernels::Gpu::new_blocking() {
            Ok(g) if !g.is_cpu() => {
                return Resolved { name: "wgpu", reason: format!("auto: hardware adapter {}", g.describe()) };
            }
            Ok(g) => skipped.push(format!("wgpu adapter {} is a CPU implementation", g.describe())),
            Err(e) => skipped.push(format!("no wgpu adapter ({e})")),
        }
    }
    let reason = if skipped.is_empty() { String::new() } else { format!("auto: {}", skipped.join("; ")) };
    Resolved { name: "cpu", reason }
}

/// Whether the NVIDIA driver is loaded (checked before touching CUDA, whose
/// initialisation panics without a driver).
#[cfg(feature = "cuda")]
fn cuda_device_present() -> bool {
    std::path::Path::new("/proc/driver/nvidia/version").exists() || std::path::Path::new("/dev/nvidiactl").exists()
}

/// Whether backend `B` sums a two-element tensor on `device` (a panic
/// while initialising it counts as no).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn answers<B: Backend>(device: B::Device) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let t = Tensor::<B, 1>::ones([2], &device);
        t.sum().into_scalar().elem::<f32>() == 2.0
    }))
    .unwrap_or(false)
}

/// Runs `w` on the backend `name` resolves to (see [`resolve`]); says on
/// stderr what `auto` chose when more than the CPU was possible.
///
/// # Errors
/// [`resolve`]'s, then the command's.
pub fn run<W: WithBackend>(name: &str, w: W) -> anyhow::Result<()> {
    let r = resolve(name)?;
    announce(&r);
    match r.name {
        #[cfg(feature = "wgpu")]
        "wgpu" => w.run::<burn::backend::Wgpu>(Default::default()),
        #[cfg(feature = "cuda")]
        "cuda" => w.run::<burn::backend::Cuda>(Default::default()),
        _ => w.run::<moe_shared::CpuBackend>(Default::default()),
    }
}

/// Prints `auto`'s choice on stderr (nothing when it had no choice).
pub fn announce(r: &Resolved) {
    if !r.reason.is_empty() {
        eprintln!("backend: {} ({})", r.name, r.reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_and_unknown_ones_list_the_built_backends() {
        assert_eq!(resolve("cpu").unwrap().name, "cpu");
        // Stored job rows name the CPU backend `ndarray`: they must keep resolving.
        assert_eq!(resolve("ndarray").unwrap().name, "cpu");
        assert_eq!(resolve("flex").unwrap().name, "cpu");
        let e = resolve("tpu").unwrap_err().to_string();
        assert!(e.contains("`tpu`") && e.contains("auto, cpu"), "{e}");
        if !cfg!(feature = "cuda") {
            assert!(resolve("cuda").unwrap_err().to_string().contains("cargo features"));
        }
    }

    #[test]
    fn auto_without_gpu_features_is_cpu() {
        if !cfg!(any(feature = "cuda", feature = "wgpu")) {
            assert_eq!(resolve("auto").unwrap(), Resolved { name: "cpu", reason: String::new() });
        }
        assert!(built().contains(&resolve("auto").unwrap().name));
    }

    /// With the `wgpu` feature on a machine whose only adapter is a CPU
    /// Vulkan (lavapipe), `auto` stays on the CPU and says why.
    #[cfg(feature = "wgpu")]
    #[test]
    fn auto_skips_a_cpu_wgpu_adapter() {
        let r = resolve("auto").unwrap();
        eprintln!("auto -> {} ({})", r.name, r.reason);
        match moe_kernels::Gpu::new_blocking() {
            Ok(g) if g.is_cpu() => {
                assert_eq!(r.name, "cpu");
                assert!(r.reason.contains("CPU implementation"), "{}", r.reason);
            }
            Ok(_) => assert_eq!(r.name, if cfg!(feature = "cuda") { r.name } else { "wgpu" }),
            Err(_) => assert_eq!(r.name, "cpu"),
        }
    }

    #[test]
    fn the_cpu_has_one_device() {
        assert_eq!(device_count("cpu"), 1);
        assert_eq!(device_count("ndarray"), 1);
        assert!(device_count("cuda") >= 1);
    }

    #[test]
    fn the_probe_computes_on_the_cpu() {
        assert!(answers::<moe_shared::CpuBackend>(Default::default()));
    }
}
