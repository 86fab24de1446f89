//! moe-studio browser studio (Leptos CSR, wasm32, built by scripts/build_web.sh).
//!
//! Every method runs locally in the browser by calling the same `moe_shared`
//! functions as the `moe-studio` CLI, so a download equals the CLI's output
//! for the same inputs. The methods and the models run in a Web Worker
//! ([`worker`]: the same module, started a second time), so the page only
//! renders; the page keeps what it shows of the models ([`models`]).
//!
//! Layout: [`web`] (files, fetch, downloads, feature detection), [`worker`]
//! (the worker, its messages, the models kept in the browser's storage),
//! [`task`] (a page's progress and Cancel), [`store`] (the worker's
//! models), [`load`] (models from files), [`compute`] (the methods),
//! [`zip`] (download archives), [`components`] and [`pages`] (the UI).

pub mod app;
pub mod bench;
pub mod components;
pub mod compute;
pub mod jobs;
pub mod load;
pub mod memory;
pub mod models;
pub mod pages;
pub mod store;
pub mod task;
pub mod validate;
pub mod web;
pub mod worker;
pub mod zip;

/// The Burn backend of the browser forward pass: `moe_shared::CpuBackend`
/// (burn-flex on the CPU, SIMD128, no threads in wasm; Burn's wgpu backend
/// spends ~30 s autotuning on software WebGPU, so it is not used).
pub type Cpu = moe_shared::CpuBackend;

/// The wasm binary's `main`: on the page, mounts the studio on `<body>`;
/// inside the studio's worker (the same module started again, see
/// [`worker`]), runs the worker.
pub fn start() {
    if worker::in_worker() {
        worker::host::start();
        return;
    }
    console_error_panic_hook::set_once();
    leptos::mount::mount_to_body(app::App);
}

/// Formats a parameter count the way model cards do (`134.5M`, `7.24B`).
pub fn format_params(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

/// Formats a byte count (`1.5 MB`).
pub fn format_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} KB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

/// One-line description of a model for the model picker, e.g.
/// `llama · 30 layers · d=576 · 134.5M params`; an MoE counts all its
/// experts and adds the parameters active per token
/// (`· 756.7K params (426.4K active per token)`).
pub fn summary_line(c: &moe_shared::config::ModelConfig, moe: Option<&moe_shared::config::MoeConfig>) -> String {
    let active = match moe {
        Some(m) => format!(" ({} active per token)", format_params(load::active_params_u64(c, Some(m)))),
        None => String::new(),
    };
    format!(
        "{} · {} layers · d={} · {} params{active}",
        c.architecture.model_type(),
        c.num_layers,
        c.hidden_size,
        format_params(load::params_u64(c, moe))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_read_like_model_cards() {
        assert_eq!(format_params(134_515_008), "134.5M");
        assert_eq!(format_params(7_241_732_096), "7.24B");
        assert_eq!(format_params(260_000), "260.0K");
        assert_eq!(format_params(12), "12");
    }

    #[test]
    fn byte_counts_are_readable() {
        assert_eq!(format_bytes(1_500_000), "1.5 MB");
        assert_eq!(format_bytes(999), "999 B");
    }
}
