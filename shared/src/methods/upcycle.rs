//! Sparse upcycling, dense -> MoE (DeltaMoE phase 1 initialisation,
//! methods.md §1; per-layer counts from NeuronMoE, §3).
//!
//! Every FFN of an MoE layer `l` becomes `E_l` experts, each a copy of the
//! dense `gate/up/down` projections (`w1 = gate_proj [f, d]`,
//! `w3 = up_proj [f, d]`, `w2 = down_proj [d, f]`), plus a new router
//! `[E_l, d]` ([`RouterInit`]). Every other tensor is copied unchanged.
//! Expert 0 is the original FFN and is frozen by default. Optional seeded
//! noise perturbs the non-frozen copies so that they can diverge (frozen
//! experts stay bit-exact copies).
//!
//! Without noise the upcycled model computes exactly the dense function for
//! any router, because the chosen top-k weights sum to 1.
//!
//! Streaming: the dense tensors are read once each, in plan order, and
//! written (with their `E_l` copies) before the next is read, so memory
//! holds about one dense tensor (in f32 and in output bytes) at a time.

use serde::Serialize;

use super::allocation::ExpertCounts;
use super::moe_plan::{MoeTensor, Origin};
use super::output::{check_dense_source, config_json, layout_sink, planned_tensors, LayoutChoice, LayoutRequest};
use super::rng::NormalRng;
use super::router_init::RouterInit;
use super::sink::{to_bytes, write_values, TensorSink};
use crate::checkpoint::{DType, PlannedTensor, TensorSource};
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};
use crate::error::{Result, StudioError};

/// How noise combines with an expert copy's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoiseKind {
    /// `w * (1 + std * n)`, `n ~ N(0, 1)`: relative to each weight.
    Multiplicative,
    /// `w + std * n`.
    Additive,
}

/// Seeded Gaussian noise on the non-frozen expert copies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CopyNoise {
    /// How it combines with the weights.
    pub kind: NoiseKind,
    /// Standard deviation (0 = no noise).
    pub std: f64,
}

impl CopyNoise {
    /// No noise.
    pub const NONE: CopyNoise = CopyNoise { kind: NoiseKind::Multiplicative, std: 0.0 };

    /// Perturbs `w` with the generator of tensor `name` under `seed`.
    pub fn apply(&self, w: &[f32], seed: u64, name: &str) -> Vec<f32> {
        let mut rng = NormalRng::for_tensor(seed, name);
        match self.kind {
            NoiseKind::Multiplicative => {
                w.iter().map(|&x| (f64::from(x) * (1.0 + self.std * rng.next_normal())) as f32).collect()
            }
            NoiseKind::Additive => w.iter().map(|&x| (f64::from(x) + self.std * rng.next_normal()) as f32).collect(),
        }
    }
}

/// Options of [`upcycle`].
#[derive(Debug, Clone)]
pub struct UpcycleOptions {
    /// Experts per layer (totals, the original FFN included).
    pub experts: ExpertCounts,
    /// Where `experts` came from, for error messages (the allocation
    /// file's path, or `--experts`).
    pub experts_source: String,
    /// Experts per token `k` (DeltaMoE / MoE-LPR: 2).
    pub top_k: usize,
    /// Frozen experts of every MoE layer (default `[0]`, the original FFN).
    pub frozen: Vec<usize>,
    /// Router initialisation.
    pub router_init: RouterInit,
    /// Noise on the non-frozen copies.
    pub noise: CopyNoise,
    /// Seed of the random router and the noise.
    pub seed: u64,
    /// Router temperature `T` of every MoE layer (folded into the router
    /// weight in every public layout).
    pub temperature: f64,
    /// Output dtype (default: each tensor's source float dtype, f32 for
    /// quantised tensors).
    pub dtype: Option<DType>,
    /// Load-balancing loss coefficient recorded in the config (0.01).
    pub router_aux_loss_coef: f64,
    /// On-disk layout (`--layout`; default `auto`).
    pub layout: LayoutRequest,
}

impl Default for UpcycleOptions {
    /// The DeltaMoE reference: 4 experts, top-2, expert 0 frozen, zero
    /// router, no noise, seed 0, temperature 1.
    fn default() -> Self {
        UpcycleOptions {
            experts: ExpertCounts::Uniform(4),
            experts_source: "--experts".into(),
            top_k: 2,
            frozen: vec![0],
            router_init: RouterInit::Zeros,
            noise: CopyNoise::NONE,
            seed: 0,
            temperature: 1.0,
            dtype: None,
            router_aux_loss_coef: 0.01,
            layout: LayoutRequest::Auto,
        }
    }
}

/// A validated upcycle: layout, tensors and `config.json`, nothing written.
#[derive(Debug, Clone)]
pub struct UpcyclePlan {
    /// The MoE layout as requested (temperature included).
    pub moe: MoeConfig,
    /// Layout choice, written config and router scales.
    pub choice: LayoutChoice,
    /// Output tensors and their origins, in write order.
    pub tensors: Vec<MoeTensor>,
    /// The writer's plan: `tensors` with output dtypes under the layout's
    /// names, then the layout's zero tensors.
    pub planned: Vec<PlannedTensor>,
    /// `config.json`.
    pub config_json: serde_json::Value,
    /// Notes for the user.
    pub warnings: Vec<String>,
}

/// Builds the MoE layout from the options.
fn moe_config(base: &ModelConfig, opts: &UpcycleOptions) -> Result<MoeConfig> {
    let counts = opts.experts.per_layer(base.num_layers, &opts.experts_source)?;
    if counts.iter().all(Option::is_none) {
        return Err(StudioError::config(&opts.experts_source, "every layer stays dense: nothing to upcycle"));
    }
    let layers = counts
        .iter()
        .map(|c| {
            c.map(|e| MoeLayerSpec {
                num_experts: e,
                top_k: opts.top_k,
                frozen: opts.frozen.clone(),
                router_bias: false,
                temperature: opts.temperature,
            })
        })
        .collect();
    let moe = MoeConfig { layers, router_aux_loss_coef: opts.router_aux_loss_coef };
    moe.validate(base, &opts.experts_source)?;
    Ok(moe)
}

/// Validates everything and plans the output (reads tensor headers only).
///
/// # Errors
/// [`StudioError::Config`]: an allocation list of the wrong length, a
/// zero-expert layer, top-k outside `1..=E_l`, a frozen expert that does not
/// exist, a non-positive temperature, bad router or noise options;
/// [`StudioError::Tensor`] when `src` lacks a dense tensor or its shape
/// disagrees with `base`; [`StudioError::Invalid`] for a non-float dtype.
pub fn plan_upcycle(src: &dyn TensorSource, base: &ModelConfig, opts: &UpcycleOptions) -> Result<UpcyclePlan> {
    let moe = moe_config(base, opts)?;
    opts.router_init.validate(&moe, base.hidden_size, &opts.experts_source)?;
    if !(opts.noise.std.is_finite() && opts.noise.std >= 0.0) {
        return Err(StudioError::config("--noise", format!("noise std must be >= 0 (got {})", opts.noise.std)));
    }
    if let Some(d) = opts.dtype.filter(|d| d.float_size().is_none()) {
        return Err(StudioError::Invalid(format!("cannot write dtype {d} (use f32, f16 or bf16)")));
    }
    check_dense_source(src, base)?;
    let choice = crate::layout::choose(base, &moe, opts.layout)?;
    let (tensors, planned) = planned_tensors(src, base, &choice.written, opts.dtype);
    let planned = choice.disk_plan(base, &planned);
    let warnings = choice.warnings.clone();
    let provenance = serde_json::json!({
        "method": "upcycle",
        "source": src.source_name(),
        "router_init": opts.router_init,
        "noise": opts.noise,
        "seed": opts.seed,
        "temperature": opts.temperature,
    });
    let dtype = planned.first().map(|p| p.dtype).unwrap_or(DType::F32);
    let config_json = config_json(base, &choice, dtype, provenance);
    Ok(UpcyclePlan { moe, choice, tensors, planned, config_json, warnings })
}

/// Streams the upcycled tensors of `plan` from `src` into `sink`.
///
/// # Errors
/// Read errors of `src`, write errors of `sink`.
pub fn write_upcycle(
    src: &dyn TensorSource,
    plan: &UpcyclePlan,
    opts: &UpcycleOptions,
    sink: &mut dyn TensorSink,
) -> Result<()> {
    let mut out = layout_sink(sink, &plan.choice, &plan.planned, plan.tensors.len());
    let sink: &mut dyn TensorSink = &mut out;
    // The dense FFN tensor being copied, its f32 values and (lazily) its
    // output bytes for the un-noised copies.
    let mut current: Option<(String, Vec<f32>, Option<Vec<u8>>)> = None;
    for (t, p) in plan.tensors.iter().zip(&plan.planned) {
        match &t.origin {
            Origin::Dense { .. } => {
                current = None;
                let v = src.read_f32(&t.name)?;
                write_values(sink, &t.name, p.dtype, &v)?;
            }
            Origin::RouterWeight { layer } => {
                let [e, d] = [t.shape[0], t.shape[1]];
                let w = opts.router_init.weight(*layer, e, d, opts.seed, &t.name, plan.choice.router_scale[*layer]);
                write_values(sink, &t.name, p.dtype, &w)?;
            }
            Origin::RouterBias { .. } => {
                write_values(sink, &t.name, p.dtype, &vec![0.0; t.shape[0]])?;
            }
            Origin::Expert { layer, expert, dense_name } => {
                if current.as_ref().map(|c| &c.0) != Some(dense_name) {
                    current = Some((dense_name.clone(), src.read_f32(dense_name)?, None));
                }
                let (_, values, bytes) = current.as_mut().expect("set above");
                let frozen = plan.moe.layers[*layer].as_ref().is_some_and(|s| s.frozen.contains(expert));
                if opts.noise.std > 0.0 && !frozen {
                    let noisy = opts.noise.apply(values, opts.seed, &t.name);
                    write_values(sink, &t.name, p.dtype, &noisy)?;
                } else if p.dtype == DType::F32 {
                    write_values(sink, &t.name, p.dtype, values)?;
                } else {
                    if bytes.is_none() {
                        *bytes = Some(to_bytes(p.dtype, values)?);
                    }
                    sink.write_tensor(&t.name, bytes.as_deref().expect("set above"))?;
                }
            }
        }
    }
    out.finish()
}

/// Upcycles the dense model `src` (configuration `base`) into an MoE
/// checkpoint directory `out_dir`: safetensors (sharded per `write_opts`),
/// `config.json` (Mixtral layout whenever possible, else the studio
/// layout) and `tokenizer.json` when given. Everything is validated before
/// the output is created; the output appears atomically at the end and no
/// partial directory is left on error.
///
/// # Errors
/// Those of [`plan_upcycle`] and [`write_upcycle`];
/// [`StudioError::Invalid`] when `out_dir` exists and is not empty; I/O.
#[cfg(not(target_arch = "wasm32"))]
pub fn upcycle(
    src: &dyn TensorSource,
    base: &ModelConfig,
    opts: &UpcycleOptions,
    out_dir: &std::path::Path,
    tokenizer_json: Option<Vec<u8>>,
    write_opts: crate::checkpoint::WriteOptions,
) -> Result<super::output::MoeReport> {
    let plan = plan_upcycle(src, base, opts)?;
    let mut w = crate::checkpoint::SafetensorsWriter::create(out_dir, plan.planned.clone(), write_opts)?;
    write_upcycle(src, &plan, opts, &mut w)?;
    let mut extra = vec![("config.json", serde_json::to_vec_pretty(&plan.config_json).expect("json"))];
    if let Some(t) = tokenizer_json {
        extra.push(("tokenizer.json", t));
    }
    w.finish(&extra)?;
    let mut report = super::output::MoeReport::new(
        "upcycle",
        vec![src.source_name().to_string()],
        base,
        &plan.choice,
        &plan.planned,
        opts.router_init.kind(),
        plan.warnings,
    );
    report.out_dir = Some(out_dir.display().to_string());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::export::dense_tensor_plan;
    use crate::checkpoint::safetensors_io::SafetensorsFile;
    use crate::checkpoint::writer::serialize_to_vec;
    use crate::checkpoint::Bytes;
    use crate::config::HfConfig;
    use crate::methods::sink::MemorySink;

    fn tiny() -> (ModelConfig, SafetensorsFile) {
        let json =
            br#"{"model_type":"llama","vocab_size":16,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":2,
            "num_attention_heads":2,"num_key_value_heads":1,"tie_word_embeddings":true}"#;
        let base = HfConfig::from_json(json, "c").unwrap().to_model_config("c").unwrap();
        let tensors: Vec<(PlannedTensor, Vec<u8>)> = dense_tensor_plan(&base)
            .into_iter()
            .enumerate()
            .map(|(k, (name, shape))| {
                let n: usize = shape.iter().product();
                let v: Vec<f32> = (0..n).map(|i| ((i * 7 + k) as f32 * 0.1).sin()).collect();
                (PlannedTensor { name, dtype: DType::F32, shape }, to_bytes(DType::F32, &v).unwrap())
            })
            .collect();
        let pairs: Vec<(PlannedTensor, &[u8])> = tensors.iter().map(|(p, b)| (p.clone(), b.as_slice())).collect();
        let bytes = serialize_to_vec(&pairs, &Default::default()).unwrap();
        (base, SafetensorsFile::parse(Bytes::from_vec(bytes), "tiny").unwrap())
    }

    #[test]
    fn in_memory_upcycle_copies_freezes_and_perturbs() {
        let (base, src) = tiny();
        let opts = UpcycleOptions {
            experts: ExpertCounts::PerLayer(vec![Some(3), None]),
            top_k: 2,
            noise: CopyNoise { kind: NoiseKind::Additive, std: 0.01 },
            temperature: 0.5,
            dtype: Some(DType::BF16),
            ..Default::default()
        };
        let plan = plan_upcycle(&src, &base, &opts).unwrap();
        assert_eq!(plan.choice.name(), "qwen2_moe", "a dense layer 1 fits Qwen2-MoE's mlp_only_layers");
        let plan = plan_upcycle(
            &src,
            &base,
            &UpcycleOptions { layout: LayoutRequest::parse("studio").unwrap(), ..opts.clone() },
        )
        .unwrap();
        assert_eq!(plan.config_json["model_type"], "moe_studio");
        assert_eq!(plan.config_json["moe_layers"][0]["temperature"], 0.5, "studio layout keeps T");
        let mut sink = MemorySink::new(plan.planned.clone());
        write_upcycle(&src, &plan, &opts, &mut sink).unwrap();
        let out = SafetensorsFile::parse(Bytes::from_vec(sink.into_safetensors().unwrap()), "out").unwrap();
        let dense = src.read_f32("model.layers.0.mlp.up_proj.weight").unwrap();
        let bf16 = |v: &[f32]| v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect::<Vec<_>>();
        let e =
            |i: usize| out.read_f32(&crate::layout::names::expert_weight_name(0, i, crate::layout::Proj::Up)).unwrap();
        assert_eq!(e(0), bf16(&dense), "frozen expert 0 is an exact copy");
        assert_ne!(e(1), e(0));
        assert_ne!(e(1), e(2), "each copy has its own noise");
        let max = e(1).iter().zip(&e(0)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max < 0.1, "additive noise of std 0.01 (max {max})");
        assert!(out.info("model.layers.1.mlp.down_proj.weight").is_some());
        assert!(out.read_f32(&crate::layout::names::router_weight_name(0)).unwrap().iter().all(|&w| w == 0.0));
    }
}
