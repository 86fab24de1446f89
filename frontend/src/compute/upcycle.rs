//! Upcycle in the browser: `plan_upcycle` + `write_upcycle` into a
//! `MemorySink`, exactly as `moe-studio upcycle` (which streams the same
//! plan into its directory writer), in runs of tensors with yields between.

use moe_shared::checkpoint::plan::Origin;
use moe_shared::config::ModelConfig;
use moe_shared::methods::{plan_upcycle, write_upcycle, AllocationFile, ExpertCounts, UpcycleOptions, UpcyclePlan};
use moe_shared::tensor_io::sink::MemorySink;
use moe_shared::tensor_io::{DType, TensorSource};

use super::artifact::{card_file, into_artifact, pretty, tokenizer_json, Output};
use super::msg;
use super::progress::Progress;
use crate::store::{Artifact, Picked};
use crate::worker::protocol::UpcycleForm;
use moe_shared::checkpoint::output::card_moe_details;
use moe_shared::tensor_io::card::{CardMethod, ModelCard};

/// Parses a number typed into the field `what`.
///
/// # Errors
/// `what: `s` is not a valid number`.
pub fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("{what}: `{s}` is not a valid number"))
}

/// The most experts per layer the page offers (the input's `max`); more
/// belong to the CLI or the server's Jobs page.
pub const MAX_EXPERTS: usize = 64;

/// The form field an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Uniform experts per layer.
    Experts,
    /// The allocation JSON.
    Allocation,
    /// top-k.
    TopK,
    /// Frozen experts.
    Frozen,
    /// Router init.
    Router,
    /// Seed.
    Seed,
    /// Output dtype.
    Dtype,
    /// Shared experts (count, gate, init).
    Shared,
    /// Drop-Upcycling ratio.
    DropRatio,
    /// Granularity.
    Granularity,
    /// Not one field (the model, its size, the tab's memory).
    Model,
}

impl Field {
    /// The field's label on the page.
    pub fn label(self) -> &'static str {
        match self {
            Field::Experts => "experts per layer",
            Field::Allocation => "allocation",
            Field::TopK => "top-k",
            Field::Frozen => "frozen experts",
            Field::Router => "router init",
            Field::Seed => "seed",
            Field::Dtype => "dtype",
            Field::Shared => "shared experts",
            Field::DropRatio => "drop ratio",
            Field::Granularity => "granularity",
            Field::Model => "model",
        }
    }

    /// The `data-testid` suffix of the field's error.
    pub fn id(self) -> &'static str {
        match self {
            Field::Experts => "experts",
            Field::Allocation => "allocation",
            Field::TopK => "topk",
            Field::Frozen => "frozen",
            Field::Router => "router",
            Field::Seed => "seed",
            Field::Dtype => "dtype",
            Field::Shared => "shared",
            Field::DropRatio => "drop",
            Field::Granularity => "granularity",
            Field::Model => "model",
        }
    }
}

/// Refuses counts above [`MAX_EXPERTS`] before any plan is made.
///
/// # Errors
/// The field and a message in the page's words.
pub fn check_counts(counts: &ExpertCounts, field: Field) -> Result<(), (Field, String)> {
    let too_many = |l: Option<usize>, e: usize| {
        let at = l.map(|l| format!("layer {l} has {e} experts")).unwrap_or_else(|| format!("{e} experts"));
        (
            field,
            format!(
                "{}: {at}, the browser studio makes at most {MAX_EXPERTS} per layer \
                 (use the CLI or the server's Jobs page for more)",
                field.label()
            ),
        )
    };
    match counts {
        ExpertCounts::Uniform(e) if *e > MAX_EXPERTS => Err(too_many(None, *e)),
        ExpertCounts::PerLayer(v) => match v.iter().enumerate().find(|(_, e)| e.is_some_and(|e| e > MAX_EXPERTS)) {
            Some((l, e)) => Err(too_many(Some(l), e.unwrap_or_default())),
            None => Ok(()),
        },
        ExpertCounts::Uniform(_) => Ok(()),
    }
}

/// A shared planning error in the page's words: the field it is about
/// (from the error's typed [`moe_shared::Param`]), named by its label
/// instead of the CLI's flag (`--experts: layer 0: top-k 3 must be ...` ->
/// `top-k: layer 0: top-k 3 must be ...`). Other configuration errors (an
/// allocation of the wrong length) belong to `experts`, the field that
/// gave the counts; anything else to the model.
pub fn plan_error(e: &moe_shared::StudioError, experts: Field) -> (Field, String) {
    use moe_shared::{Param, StudioError};
    let (field, what) = match e {
        StudioError::Param { param, what, .. } => (
            match param {
                Param::DropRatio => Field::DropRatio,
                Param::Granularity => Field::Granularity,
                Param::SharedExperts => Field::Shared,
                Param::TopK => Field::TopK,
                Param::Frozen => Field::Frozen,
                Param::Router | Param::Temperature => Field::Router,
                Param::Experts | Param::ExpertWidth => experts,
                // The tab adds no noise to its copies: no field of its own.
                Param::Noise => Field::Model,
            },
            what,
        ),
        StudioError::Config { what, .. } => (experts, what),
        e => return (Field::Model, e.to_string()),
    };
    (field, format!("{}: {what}", field.label()))
}

/// The dtype of the upcycled checkpoint for the form's `dtype`: `auto`
/// keeps a float source's dtype and writes bf16 for a quantized source
/// (GGUF Q4/Q8 weights upcast to f32 would be 4-8x the file; SmolLM2 to 4
/// experts is 1.5 GB in f32, 0.75 GB in bf16), `source` is the CLI's
/// default (f32 for a quantized source).
pub fn output_dtype(form: &str, source: &dyn TensorSource) -> Result<Option<DType>, (Field, String)> {
    match form {
        "auto" => {
            let quantized = source.tensors().iter().any(|t| t.dtype.float_size().is_none());
            Ok(quantized.then_some(DType::BF16))
        }
        "source" => Ok(None),
        d => DType::parse_float(d).map(Some).ok_or_else(|| (Field::Dtype, format!("dtype: unknown dtype {d}"))),
    }
}

/// Where the page shows an error about an operation parameter, by the
/// parameter's key (`UpcycleParams::form_fields`' keys, the server's
/// `spec.FIELD`): the view decides (`crate::pages::upcycle::slot_of`);
/// `None` puts it with the expert counts. The worker, which shows only
/// the message, passes [`no_slot`].
pub type Slots = fn(&str) -> Option<Field>;

/// The [`Slots`] of a caller that shows only the message.
pub fn no_slot(_key: &str) -> Option<Field> {
    None
}

/// The `UpcycleOptions` of the form for a model with tensors `source`
/// (errors name the form field, in the page's words; `slots` places the
/// operation's rules' errors).
///
/// # Errors
/// A value that does not parse, more than [`MAX_EXPERTS`] experts.
pub fn options(form: &UpcycleForm, source: &dyn TensorSource, slots: Slots) -> Result<UpcycleOptions, (Field, String)> {
    let at = |f: Field| move |e: String| (f, e);
    let (experts, experts_source, field) = match &form.allocation {
        Some(raw) => (
            AllocationFile::parse(raw.as_bytes(), "allocation").map_err(|e| (Field::Allocation, e.to_string()))?,
            "allocation".to_string(),
            Field::Allocation,
        ),
        None => {
            let e = num(&form.experts, "experts per layer").map_err(at(Field::Experts))?;
            (ExpertCounts::Uniform(e), "experts per layer".to_string(), Field::Experts)
        }
    };
    check_counts(&experts, field)?;
    let p = &form.params;
    // The server's upcycle rules (shared `JobSpec::validate`), next to the field.
    let (uniform, per_layer) = match &experts {
        ExpertCounts::Uniform(e) => (Some(*e), None),
        ExpertCounts::PerLayer(v) => (None, Some(v.clone())),
    };
    crate::validate::upcycle(uniform, per_layer, p).map_err(|e| (slots(&e.key).unwrap_or(field), e.message))?;
    // The tab offers the zero and the random router (no prompts).
    let o = p.options(experts, &experts_source, None).map_err(|e| (Field::Router, e.to_string()))?;
    Ok(UpcycleOptions { dtype: output_dtype(&form.dtype, source)?, ..o })
}

/// The options and the plan of the form for a model (`source`, `config`),
/// refused — in the page's words, with the field they are about — when
/// they are invalid or the MoE would not fit a tab. The page runs it on
/// every change; the worker runs it again before the work.
///
/// # Errors
/// As [`options`], [`plan_error`], and the tab's size limit
/// (`crate::load::check_fits`).
pub fn plan(
    form: &UpcycleForm,
    source: &dyn TensorSource,
    config: &ModelConfig,
    slots: Slots,
) -> Result<(UpcycleOptions, UpcyclePlan), (Field, String)> {
    let o = options(form, source, slots)?;
    let field = if form.allocation.is_some() { Field::Allocation } else { Field::Experts };
    let plan = plan_upcycle(source, config, &o).map_err(|e| plan_error(&e, field))?;
    let model = |e: String| (Field::Model, e);
    crate::load::check_fits("the upcycled model", config, Some(&plan.moe)).map_err(model)?;
    let need = crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64));
    crate::memory::ensure("the upcycle", need).map_err(model)?;
    Ok((o, plan))
}

/// Upcycles the dense model `src` with `opts`; progress in output tensors.
///
/// # Errors
/// An MoE or too-large input, the plan's validation errors.
pub fn run(progress: &Progress, src: &Picked, opts: &UpcycleOptions) -> Result<Artifact, String> {
    let t0 = crate::web::now_ms();
    let m = src.model();
    if m.moe.is_some() {
        return Err(format!("{} is already an MoE; upcycle takes a dense model", src.name()));
    }
    let plan = plan_upcycle(m.source.as_ref(), &m.config, opts).map_err(msg)?;
    crate::load::check_fits("the upcycled model", &m.config, Some(&plan.moe))?;
    crate::memory::ensure("the upcycle", crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64)))?;
    let keys: Vec<Option<String>> = plan
        .tensors
        .iter()
        .map(|t| match &t.origin {
            Origin::Expert { dense_name, .. } | Origin::SharedExpert { dense_name, .. } => Some(dense_name.clone()),
            _ => None,
        })
        .collect();
    let runs = super::slices::runs(&keys);
    let mut sink = MemorySink::new(plan.planned.clone());
    let mut part =
        UpcyclePlan { tensors: Vec::new(), planned: Vec::new(), config_json: serde_json::Value::Null, ..plan.clone() };
    let n = plan.tensors.len() as u64;
    for r in &runs {
        part.tensors = plan.tensors[r.clone()].to_vec();
        part.planned = plan.planned[r.clone()].to_vec();
        write_upcycle(m.source.as_ref(), &part, opts, &mut sink).map_err(msg)?;
        progress.step("copying FFNs into experts", r.end as u64, n, "tensors");
    }
    // The layout's zero tensors (a Qwen2-MoE zero shared expert) end the plan.
    moe_shared::checkpoint::output::layout_sink(&mut sink, &plan.choice, &plan.planned, plan.tensors.len())
        .finish()
        .map_err(msg)?;
    progress.step("serialising safetensors", 0, 1, "files");
    let safetensors = sink.into_safetensors().map_err(msg)?;
    let experts = plan.moe.layers.iter().flatten().map(|s| s.num_experts).max().unwrap_or(0);
    let name = format!("{}-upcycled-{}x", src.name().trim_end_matches(".bin").trim_end_matches(".gguf"), experts);
    let mut card = ModelCard::new(CardMethod::Upcycling).input("dense base", src.name(), None);
    card_moe_details(&mut card, &m.config, &plan.choice, &plan.planned);
    let readme = card_file(card, &name, &plan.config_json);
    let out = Output {
        name,
        method: "upcycle",
        safetensors,
        config_json: pretty(&plan.config_json),
        tokenizer: m.tokenizer.clone(),
        tokenizer_json: tokenizer_json(m.tokenizer.as_ref()),
        extra: vec![readme],
        millis: crate::web::now_ms() - t0,
    };
    into_artifact(out)
}

/// A one-layer dense llama (d = 8, f = 12, every weight 0.5) in `dtype`,
/// as its config and safetensors source: the tests' model.
#[cfg(test)]
pub(crate) fn tiny_dense(dtype: DType) -> (ModelConfig, moe_shared::tensor_io::safetensors_io::SafetensorsFile) {
    use moe_shared::tensor_io::PlannedTensor;
    let cfg = br#"{"model_type":"llama","vocab_size":32,"hidden_size":8,"intermediate_size":12,
        "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":2,"tie_word_embeddings":true}"#;
    let base = moe_shared::config::HfConfig::from_json(cfg, "c").unwrap().to_model_config("c").unwrap();
    let plan: Vec<PlannedTensor> = moe_shared::checkpoint::plan::dense_tensor_plan(&base)
        .into_iter()
        .map(|(name, shape)| PlannedTensor { name, dtype, shape })
        .collect();
    let mut sink = MemorySink::new(plan.clone());
    for p in &plan {
        let n: usize = p.shape.iter().product();
        moe_shared::tensor_io::sink::write_values(&mut sink, &p.name, dtype, &vec![0.5; n]).unwrap();
    }
    let src = moe_shared::tensor_io::safetensors_io::SafetensorsFile::parse(
        moe_shared::tensor_io::Bytes::from_vec(sink.into_safetensors().unwrap()),
        "tiny",
    )
    .unwrap();
    (base, src)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_experts_than_the_page_offers_are_refused() {
        assert!(check_counts(&ExpertCounts::Uniform(64), Field::Experts).is_ok());
        for e in [65, 100_000] {
            let (f, m) = check_counts(&ExpertCounts::Uniform(e), Field::Experts).unwrap_err();
            assert_eq!(f, Field::Experts);
            assert!(
                m.starts_with(&format!("experts per layer: {e} experts, the browser studio makes at most 64")),
                "{m}"
            );
        }
        let (f, m) =
            check_counts(&ExpertCounts::PerLayer(vec![Some(2), None, Some(65)]), Field::Allocation).unwrap_err();
        assert_eq!(f, Field::Allocation);
        assert!(m.starts_with("allocation: layer 2 has 65 experts"), "{m}");
    }

    #[test]
    fn shared_errors_name_the_form_field_not_the_cli_flag() {
        use moe_shared::config::{MoeConfig, MoeLayerSpec};
        let cfg = br#"{"model_type":"llama","vocab_size":32,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":2}"#;
        let base = moe_shared::config::HfConfig::from_json(cfg, "c").unwrap().to_model_config("c").unwrap();
        let spec =
            |k: usize, frozen: Vec<usize>| MoeLayerSpec { num_experts: 2, top_k: k, frozen, ..Default::default() };
        let check = |s: MoeLayerSpec| {
            let e = MoeConfig::uniform(2, s).validate(&base, "experts per layer").unwrap_err();
            plan_error(&e, Field::Experts)
        };
        let (f, m) = check(spec(3, vec![0]));
        assert_eq!(f, Field::TopK);
        assert!(m.starts_with("top-k: layer 0: top-k 3 must be between 1 and the expert count 2"), "{m}");
        let (f, m) = check(spec(1, vec![5]));
        assert_eq!(
            (f, m.as_str()),
            (Field::Frozen, "frozen experts: layer 0: frozen expert 5 does not exist (2 experts)")
        );
        let (f, m) = check(MoeLayerSpec { num_experts: 0, ..spec(1, vec![]) });
        assert_eq!(f, Field::Experts);
        assert!(!m.contains("--"), "{m}");
    }

    /// The request's typed parameters reach the options as the CLI's do
    /// (`UpcycleParams::options`), and what the tab cannot do or the rules
    /// refuse lands next to its field.
    #[test]
    fn the_requests_parameters_are_the_operations() {
        use moe_shared::ops::upcycle::{RouterInitArg, UpcycleParams};
        let (_, src) = tiny_dense(DType::BF16);
        let form =
            |params: UpcycleParams| UpcycleForm { allocation: None, experts: "3".into(), dtype: "f16".into(), params };
        let slots = crate::pages::upcycle::slot_of;
        let o = options(&form(UpcycleParams { drop_ratio: 0.5, seed: 7, ..Default::default() }), &src, slots).unwrap();
        assert!(matches!(o.experts, ExpertCounts::Uniform(3)));
        assert_eq!((o.top_k, o.frozen.as_slice(), o.seed, o.drop_ratio), (2, &[0][..], 7, 0.5));
        assert_eq!(o.dtype, Some(DType::F16));
        let (f, _) = options(&form(UpcycleParams { top_k: 0, ..Default::default() }), &src, slots).unwrap_err();
        assert_eq!(f, Field::TopK);
        let (f, m) =
            options(&form(UpcycleParams { router_init: RouterInitArg::CheapEmbed, ..Default::default() }), &src, slots)
                .unwrap_err();
        assert_eq!(f, Field::Router, "{m}");
    }
}
