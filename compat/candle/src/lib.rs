//! Empty: this crate only holds `tests/candle_loads_exports.rs` (an opt-in
//! check that candle-transformers loads moe-studio's MoE exports).
