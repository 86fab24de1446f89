//! The registered checkpoints: name, architecture, layers and experts per
//! layer (read from the summary's router tensors), size, format, files and
//! the job that made it.

use leptos::prelude::*;
use moe_shared::api::ModelSummary;

use super::state::{short, Ctx};

/// Experts of each layer of a summarised model (`None` for a dense FFN):
/// the summary's MoE structure when it has one, else the routers' shapes
/// (`[E, d]`, canonical names parsed by `moe_shared::layout::names`).
pub fn experts_per_layer(s: &ModelSummary) -> Vec<Option<usize>> {
    use moe_shared::layout::names::{parse, TensorRole};
    if let Some(m) = &s.moe {
        return m.experts_per_layer.clone();
    }
    let mut v = vec![None; s.config.num_layers];
    for t in &s.tensors {
        if let (TensorRole::Router { layer }, Some(&e)) = (parse(&t.name), t.shape.first()) {
            if layer < v.len() {
                v[layer] = Some(e);
            }
        }
    }
    v
}

/// `8 layers · dense`, `8 layers · 2 experts`, `4 layers · experts 2,-,4,4`.
pub fn describe_layers(s: &ModelSummary) -> String {
    let per = experts_per_layer(s);
    let moe = match per.first() {
        _ if per.iter().all(Option::is_none) => "dense".to_string(),
        Some(Some(e)) if per.iter().all(|x| *x == Some(*e)) => format!("{e} experts"),
        _ => format!(
            "experts {}",
            per.iter().map(|x| x.map(|e| e.to_string()).unwrap_or_else(|| "-".into())).collect::<Vec<_>>().join(",")
        ),
    };
    format!("{} layers · {moe}", per.len())
}

/// The checkpoints table (`data-testid=checkpoint-{id}`; the layers cell
/// `checkpoint-layers-{id}`).
pub fn checkpoint_table(ctx: Ctx) -> impl IntoView {
    move || {
        view! {
            <table class="grid" data-testid="checkpoints">
                <thead><tr><th>"name"</th><th>"architecture"</th><th>"layers"</th><th>"parameters"</th><th>"format"</th><th>"files"</th><th>"from job"</th></tr></thead>
                <tbody>
                    {ctx.checkpoints.get().into_iter().map(|c| {
                        let id = c.id.clone();
                        let layers = move || ctx.summaries.with(|m| m.get(&id).map(describe_layers)).unwrap_or_else(|| "…".into());
                        view! {
                            <tr data-testid=format!("checkpoint-{}", c.id)>
                                <td><b>{c.name.clone()}</b></td>
                                <td>{c.architecture.clone()}</td>
                                <td data-testid=format!("checkpoint-layers-{}", c.id)>{layers}</td>
                                <td>{crate::format_params(c.parameters as u64)}</td>
                                <td>{format!("{:?}", c.format)}</td>
                                <td class="small">{c.files.iter().map(|f| format!("{} ({})", f.name, crate::format_bytes(f.size))).collect::<Vec<_>>().join(", ")}</td>
                                <td>{c.source_job.as_deref().map(short).unwrap_or_default()}</td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_shared::api::TensorSummary;

    fn summary(layers: usize, gates: &[(usize, usize)]) -> ModelSummary {
        let mut s: ModelSummary = serde_json::from_value(serde_json::json!({
            "path": "m", "format": "safetensors", "parameters": 0, "dtypes": {}, "tensors": [], "tokenizer_vocab": null,
            "config": {"architecture": "llama", "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
                "num_layers": layers, "num_heads": 2, "num_kv_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "rope_scaling": {"rope_type": "default"}, "max_position_embeddings": 64,
                "tie_word_embeddings": true, "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2}
        }))
        .unwrap();
        for &(l, e) in gates {
            s.tensors.push(TensorSummary {
                name: format!("model.layers.{l}.block_sparse_moe.gate.weight"),
                dtype: "F32".into(),
                shape: vec![e, 8],
            });
            s.tensors.push(TensorSummary {
                name: format!("model.layers.{l}.block_sparse_moe.experts.0.w1.weight"),
                dtype: "F32".into(),
                shape: vec![16, 8],
            });
        }
        s
    }

    #[test]
    fn layers_and_experts_come_from_the_routers() {
        assert_eq!(describe_layers(&summary(2, &[])), "2 layers · dense");
        assert_eq!(describe_layers(&summary(2, &[(0, 2), (1, 2)])), "2 layers · 2 experts");
        assert_eq!(experts_per_layer(&summary(3, &[(0, 2), (2, 4)])), vec![Some(2), None, Some(4)]);
        assert_eq!(describe_layers(&summary(3, &[(0, 2), (2, 4)])), "3 layers · experts 2,-,4");
    }
}
