//! moe-studio browser studio (Leptos CSR, wasm32, built with trunk).
//!
//! The pages arrive with the browser-studio work; this crate already holds
//! the display helpers they share and compiles natively (for tests) and for
//! `wasm32-unknown-unknown`.

/// Formats a parameter count the way model cards do (`134.5M`, `7.24B`).
pub fn format_params(n: usize) -> String {
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

/// One-line description of a dense model for the model picker, e.g.
/// `llama · 30 layers · d=576 · 134.5M params`.
pub fn summary_line(c: &moe_shared::config::ModelConfig) -> String {
    format!(
        "{} · {} layers · d={} · {} params",
        c.architecture.model_type(),
        c.num_layers,
        c.hidden_size,
        format_params(c.num_parameters())
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
}
