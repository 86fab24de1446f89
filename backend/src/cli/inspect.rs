//! `moe-studio inspect MODEL`.

use std::path::PathBuf;

use anyhow::Context;
use moe_shared::api::{ModelSummary, MoeSummary};
use moe_shared::checkpoint::open_model;
use moe_shared::layout::ExpertsFormat;

/// Arguments of `inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, a `.gguf` file or a llama2.c `.bin`.
    pub model: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also list every tensor (text mode).
    #[arg(long)]
    pub tensors: bool,
}

/// Runs `inspect`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let m = open_model(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let s = ModelSummary::new(
        &m.path,
        m.format,
        &m.config,
        m.source.as_ref(),
        m.tokenizer.as_ref().map(|t| t.vocab_size()),
    )
    .with_moe(m.moe.as_ref(), m.layout)
    .with_experts_format(m.experts_format);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let c = &s.config;
    println!("model        {}", s.path);
    println!("format       {:?}", s.format);
    println!(
        "architecture {} ({} layers, d={}, ffn={}, heads {}/{} kv, head_dim {})",
        c.architecture.model_type(),
        c.num_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim
    );
    println!("vocab        {}{}", c.vocab_size, if c.tie_word_embeddings { " (tied LM head)" } else { "" });
    println!("rope         theta {} {:?}; context {}", c.rope_theta, c.rope_scaling, c.max_position_embeddings);
    println!("parameters   {} ({:.2} M)", s.parameters, s.parameters as f64 / 1e6);
    let dt: Vec<String> = s.dtypes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("dtypes       {}", dt.join(", "));
    println!("tensors      {}", s.tensors.len());
    if let Some(moe) = &s.moe {
        print_moe(moe);
    }
    match s.tokenizer_vocab {
        Some(v) => println!("tokenizer    {v} tokens"),
        None => println!("tokenizer    none found"),
    }
    if a.tensors {
        for t in &s.tensors {
            println!("  {:<60} {:>6} {:?}", t.name, t.dtype, t.shape);
        }
    }
    Ok(())
}

/// `[a, b, c]` with runs of equal entries written once as `a x N`.
fn runs<T: PartialEq>(v: &[T], show: impl Fn(&T) -> String) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i + 1;
        while j < v.len() && v[j] == v[i] {
            j += 1;
        }
        let n = j - i;
        parts.push(if n > 1 { format!("{} x{n}", show(&v[i])) } else { show(&v[i]) });
        i = j;
    }
    format!("[{}]", parts.join(", "))
}

/// The MoE lines of the text output.
fn print_moe(m: &MoeSummary) {
    let opt = |x: &Option<usize>| x.map(|v| v.to_string()).unwrap_or_else(|| "dense".into());
    match moe_shared::layout::by_name(&m.layout).filter(|l| l.public()) {
        Some(l) => println!("moe layout   {} ({})", m.layout, l.loaders()),
        None => println!(
            "moe layout   {} (transformers cannot load it: {})",
            m.layout,
            m.studio_reason.as_deref().unwrap_or("studio-only features")
        ),
    }
    if !m.public_layouts.is_empty() {
        println!("public       {} (convert --layout NAME)", m.public_layouts.join(", "));
    }
    match m.experts_format {
        Some(ExpertsFormat::Packed) => {
            println!("stored       packed experts (experts.gate_up_proj / experts.down_proj, transformers 5)")
        }
        Some(ExpertsFormat::PerExpert) => println!("stored       per expert"),
        None => {}
    }
    let moe_layers = m.experts_per_layer.iter().filter(|e| e.is_some()).count();
    println!(
        "experts      {} per layer ({} of {} layers MoE, {} experts in all)",
        runs(&m.experts_per_layer, opt),
        moe_layers,
        m.experts_per_layer.len(),
        m.experts_per_layer.iter().flatten().sum::<usize>()
    );
    println!("top-k        {} per layer", runs(&m.top_k_per_layer, opt));
    let frozen = |f: &Vec<usize>| {
        if f.is_empty() {
            "none".to_string()
        } else {
            format!("{f:?}")
        }
    };
    println!("frozen       {} per layer", runs(&m.frozen_experts, frozen));
    let biased = m.router_bias.iter().filter(|&&b| b).count();
    println!("router bias  {}", if biased == 0 { "no".to_string() } else { format!("yes ({biased} layers)") });
    let temps: Vec<Option<String>> = m.temperature_per_layer.iter().map(|t| t.map(|t| format!("{t}"))).collect();
    if temps.iter().flatten().any(|t| t != "1") {
        println!("temperature  {} per layer", runs(&temps, |t| t.clone().unwrap_or_else(|| "dense".into())));
    }
    if !m.shared_experts_per_layer.is_empty() {
        println!("shared       {} per layer (always active)", runs(&m.shared_experts_per_layer, |n| n.to_string()));
    }
    if !m.expert_width_per_layer.is_empty() {
        println!("expert width {} per layer", runs(&m.expert_width_per_layer, opt));
    }
    if !m.unnormalised_top_k_layers.is_empty() {
        println!(
            "top-k weight softmax over all experts (norm_topk_prob false) in layers {:?}",
            m.unnormalised_top_k_layers
        );
    }
    if !m.selection_bias_layers.is_empty() {
        println!("aux-free     selection bias in layers {:?}", m.selection_bias_layers);
    }
    println!(
        "moe params   {} total ({:.2} M), {} active per token ({:.2} M)",
        m.total_parameters,
        m.total_parameters as f64 / 1e6,
        m.active_parameters_per_token,
        m.active_parameters_per_token as f64 / 1e6
    );
}
