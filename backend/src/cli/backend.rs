//! Burn backend selection at run time among those compiled in.

use burn::tensor::backend::Backend;

/// A command generic over the Burn backend.
pub trait WithBackend {
    /// Runs with backend `B` on `device`.
    fn run<B: Backend>(self, device: B::Device) -> anyhow::Result<()>;
}

/// Runs `w` on the backend named `name` (`ndarray`/`cpu`, and `wgpu` or
/// `cuda` when built with those features).
pub fn run<W: WithBackend>(name: &str, w: W) -> anyhow::Result<()> {
    match name {
        "ndarray" | "cpu" => w.run::<burn::backend::NdArray<f32>>(Default::default()),
        #[cfg(feature = "wgpu")]
        "wgpu" => w.run::<burn::backend::Wgpu>(Default::default()),
        #[cfg(feature = "cuda")]
        "cuda" => w.run::<burn::backend::Cuda>(Default::default()),
        other => anyhow::bail!(
            "backend `{other}` is not available in this build (built: ndarray{}{})",
            if cfg!(feature = "wgpu") { ", wgpu" } else { "" },
            if cfg!(feature = "cuda") { ", cuda" } else { "" }
        ),
    }
}
