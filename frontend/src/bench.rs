//! The tab's forward throughput, for the end-to-end suites: exported to
//! JavaScript (index.html puts the bindings on `window.wasmBindings`), so
//! Playwright measures exactly the wasm the studio ships.
//!
//! `bench_forward(tokens, repeat)` takes the model loaded last on the Load
//! page (the demo model when none is: stories260K, or SmolLM2 in the
//! opt-in run), builds it on the tab's backend ([`crate::Cpu`]) and times the forward
//! pass over `tokens` synthetic ids (`(i * 7919 + 13) % vocab`, the ids of
//! `moe-studio bench prefill`), all logits, one warm-up then `repeat` runs.
//! Returns JSON `{"tokens", "seconds": [...], "tokens_per_s", "backend"}`.

use wasm_bindgen::prelude::*;

use crate::compute::{cpu_model, tokens as token_tensor};

/// See the module documentation.
///
/// # Errors
/// No model is loaded and the demo model is not served (as text).
#[wasm_bindgen]
pub async fn bench_forward(tokens: usize, repeat: usize) -> Result<String, JsValue> {
    let loaded = crate::store::with_store(|s| s.inputs.iter().rev().flatten().next().cloned());
    let demo;
    let (name, m) = match &loaded {
        Some(im) => (im.name.clone(), &im.model),
        None => {
            demo = crate::load::demo_model().await.map_err(|e| JsValue::from_str(&e))?;
            (demo.0.clone(), &demo.1)
        }
    };
    let model = cpu_model(m).map_err(|e| JsValue::from_str(&e))?;
    let n = tokens.clamp(1, m.config.max_position_embeddings);
    let ids: Vec<u32> = (0..n).map(|i| ((i * 7919 + 13) % m.config.vocab_size) as u32).collect();
    let run = || {
        let _ = model.forward(token_tensor(&ids), None).into_data();
    };
    run();
    let mut secs = Vec::new();
    for _ in 0..repeat.max(1) {
        let t0 = crate::web::now_ms();
        run();
        secs.push((crate::web::now_ms() - t0) / 1000.0);
    }
    let mut sorted = secs.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let median = sorted[sorted.len() / 2];
    Ok(serde_json::json!({
        "model": name, "tokens": n, "seconds": secs, "tokens_per_s": n as f64 / median,
        "backend": "burn-flex (wasm32, SIMD128, one thread)",
    })
    .to_string())
}
