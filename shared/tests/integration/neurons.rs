//! NeuronMoE language-specific neurons (methods.md §3):
//! - Average Precision equals scikit-learn's `average_precision_score` on
//!   random score vectors (heavy ties included) and on real SmolLM2 pooled
//!   activations (golden values from tests/reference/make_ap_golden.py),
//!   through both the single-label function and the production table path;
//! - a planted neuron that fires only on one language's texts in a tiny
//!   model built here ranks first with AP 1.0 (mean and max pooling);
//! - bad input gives clear errors;
//! - `dump_real_scores` (ignored) writes the real activations the golden
//!   script reads.

use crate::common;

use moe_shared::config::{Architecture, ModelConfig, RopeScaling};
use moe_shared::methods::allocate::{compare_allocations, neuronmoe_allocation, AllocationMethod, ExpertRange};
use moe_shared::methods::neurons::{
    analyze, average_precision, average_precision_table, AnalysisOptions, CollectOptions, ComponentUnits,
    NeuronCollector, NeuronLayout, NeuronReport, PooledActivations,
};
use moe_shared::methods::AllocationFile;
use moe_shared::model::{load_transformer, Pooling, Transformer};
use moe_shared::tensor_io::{DType, TensorInfo, TensorSource};
use moe_shared::CpuBackend;

type B = CpuBackend;

/// Largest |ours − scikit-learn| allowed: both sum the same terms in f64,
/// in a different order.
const TOL: f64 = 1e-12;

fn f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

#[test]
fn ap_matches_sklearn_on_random_scores() {
    let Some(g) = common::golden_json("average_precision.json") else { return };
    let cases = g["random"].as_array().unwrap();
    assert!(cases.len() >= 8);
    let mut worst = 0.0f64;
    for c in cases {
        let scores = f32s(&c["scores"]);
        let pos: Vec<bool> = c["labels"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap() == 1).collect();
        let ours = average_precision(&scores, &pos).unwrap();
        let want = c["ap"].as_f64().unwrap();
        worst = worst.max((ours - want).abs());
        assert!((ours - want).abs() <= TOL, "{}: ours {ours} sklearn {want}", c["name"]);
    }
    eprintln!("random cases: {} checked, max |diff| = {worst:e}", cases.len());
}

/// A pooled matrix whose columns are the golden real cases (one fake
/// one-unit component per neuron).
fn matrix_of(cases: &[&serde_json::Value], languages: Vec<String>, labels: Vec<usize>) -> PooledActivations {
    let cols: Vec<Vec<f32>> = cases.iter().map(|c| f32s(&c["scores"])).collect();
    let t = labels.len();
    let mut data = Vec::with_capacity(t * cols.len());
    for r in 0..t {
        for c in &cols {
            data.push(c[r]);
        }
    }
    let layout = NeuronLayout {
        layers: vec![cols.iter().map(|_| ComponentUnits { component: "q_proj".into(), units: 1 }).collect()],
        frozen_experts: Vec::new(),
    };
    let nl = languages.len();
    PooledActivations {
        layout,
        languages,
        labels,
        data,
        tokens: vec![0; nl],
        hidden_means: vec![Vec::new(); nl],
        hidden_size: 0,
        options: CollectOptions::default(),
    }
}

#[test]
fn ap_matches_sklearn_on_real_activations() {
    let Some(g) = common::golden_json("average_precision.json") else { return };
    let Some(real) = g.get("real") else {
        panic!("average_precision.json has no real cases: regenerate it with the dump (see make_ap_golden.py)");
    };
    let languages: Vec<String> =
        real["languages"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect();
    let labels: Vec<usize> = real["labels"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let cases: Vec<&serde_json::Value> = real["cases"].as_array().unwrap().iter().collect();
    assert!(!cases.is_empty());
    let mut worst = 0.0f64;
    let mut ties = 0;
    // Single-label path.
    for c in &cases {
        let scores = f32s(&c["scores"]);
        if (c["distinct_scores"].as_u64().unwrap() as usize) < scores.len() {
            ties += 1;
        }
        for (lang, want) in c["ap"].as_array().unwrap().iter().enumerate() {
            let pos: Vec<bool> = labels.iter().map(|&l| l == lang).collect();
            let ours = average_precision(&scores, &pos).unwrap();
            let want = want.as_f64().unwrap();
            worst = worst.max((ours - want).abs());
            assert!((ours - want).abs() <= TOL, "{} lang {lang}: ours {ours} sklearn {want}", c["name"]);
        }
    }
    assert!(ties >= cases.len() / 2, "the real cases should include ties ({ties} of {})", cases.len());
    // Production path: the block-transposed, threaded table over every
    // language at once.
    let p = matrix_of(&cases, languages.clone(), labels.clone());
    for threads in [1, 3] {
        let table = average_precision_table(&p, threads).unwrap();
        for (j, c) in cases.iter().enumerate() {
            for (lang, want) in c["ap"].as_array().unwrap().iter().enumerate() {
                let ours = table.ap[lang][j];
                assert!((ours - want.as_f64().unwrap()).abs() <= TOL, "{} lang {lang} (table)", c["name"]);
            }
        }
    }
    eprintln!(
        "real cases: {} neurons x {} languages, {ties} with ties, max |diff| = {worst:e}",
        cases.len(),
        languages.len()
    );
}

// ---------------------------------------------------------------------------
// Planted neuron

struct Mem(Vec<(TensorInfo, Vec<f32>)>);

impl TensorSource for Mem {
    fn source_name(&self) -> &str {
        "planted"
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.0.iter().map(|(i, _)| i.clone()).collect()
    }
    fn read_f32(&self, name: &str) -> moe_shared::Result<Vec<f32>> {
        self.0
            .iter()
            .find(|(i, _)| i.name == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| moe_shared::StudioError::tensor("planted", name, "missing"))
    }
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn normal(&mut self, scale: f32) -> f32 {
        // Sum of uniforms (Irwin–Hall), good enough for weights.
        let s: f32 = (0..6).map(|_| self.next() as f32 / u32::MAX as f32).sum();
        (s - 3.0) * scale
    }
}

const V: usize = 30;
const D: usize = 16;
const F: usize = 32;
const PLANT_LAYER: usize = 1;
const PLANT_UNIT: usize = 5;

fn tiny_config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: V,
        hidden_size: D,
        intermediate_size: F,
        num_layers: 2,
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::Default,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        attention_bias: false,
        bos_token_id: None,
        eos_token_id: None,
        family_params: Default::default(),
    }
}

/// Tokens `0..10` are language A, `10..20` B, `20..30` C; token `t` has the
/// embedding of base token `t % 10` except dimension 0, which is +3 for A
/// and −3 for B and C. No weight reads dimension 0 (its input column is
/// zero) and none writes it (o/down rows 0 are zero), except the planted
/// neuron: layer 1 `gate_proj` unit 5 reads only dimension 0, and its
/// `down_proj` column is zero so nothing downstream sees it. Texts of A, B
/// and C share base sequences, so every other neuron scores them exactly
/// alike (ties), and only the planted one separates A.
fn planted_model() -> Transformer<B> {
    let c = tiny_config();
    let mut rng = Lcg(7);
    let mut t: Vec<(TensorInfo, Vec<f32>)> = Vec::new();
    let mut put = |name: String, shape: Vec<usize>, v: Vec<f32>| {
        t.push((TensorInfo { name, dtype: DType::F32, shape }, v));
    };
    let base: Vec<Vec<f32>> = (0..10).map(|_| (0..D).map(|_| rng.normal(1.0)).collect()).collect();
    let mut emb = Vec::new();
    for tok in 0..V {
        let mut e = base[tok % 10].clone();
        e[0] = if tok < 10 { 3.0 } else { -3.0 };
        emb.extend(e);
    }
    put("model.embed_tokens.weight".into(), vec![V, D], emb);
    // [out, in] with column 0 zero (reads) and/or row 0 zero (writes).
    let mut lin = |out: usize, inp: usize, zero_col0: bool, zero_row0: bool| -> Vec<f32> {
        let mut w: Vec<f32> = (0..out * inp).map(|_| rng.normal(0.3)).collect();
        for o in 0..out {
            for i in 0..inp {
                if (zero_col0 && i == 0) || (zero_row0 && o == 0) {
                    w[o * inp + i] = 0.0;
                }
            }
        }
        w
    };
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        put(format!("{p}.input_layernorm.weight"), vec![D], vec![1.0; D]);
        put(format!("{p}.post_attention_layernorm.weight"), vec![D], vec![1.0; D]);
        put(format!("{p}.self_attn.q_proj.weight"), vec![16, D], lin(16, D, true, false));
        put(format!("{p}.self_attn.k_proj.weight"), vec![8, D], lin(8, D, true, false));
        put(format!("{p}.self_attn.v_proj.weight"), vec![8, D], lin(8, D, true, false));
        put(format!("{p}.self_attn.o_proj.weight"), vec![D, 16], lin(D, 16, false, true));
        let mut gate = lin(F, D, true, false);
        let up = lin(F, D, true, false);
        let mut down = lin(D, F, false, true);
        if l == PLANT_LAYER {
            for i in 0..D {
                gate[PLANT_UNIT * D + i] = if i == 0 { 4.0 } else { 0.0 };
            }
            for o in 0..D {
                down[o * F + PLANT_UNIT] = 0.0;
            }
        }
        put(format!("{p}.mlp.gate_proj.weight"), vec![F, D], gate);
        put(format!("{p}.mlp.up_proj.weight"), vec![F, D], up);
        put(format!("{p}.mlp.down_proj.weight"), vec![D, F], down);
    }
    put("model.norm.weight".into(), vec![D], vec![1.0; D]);
    load_transformer::<B>(&c, None, &Mem(t), &Default::default()).unwrap()
}

/// `n` base sequences of 4..12 tokens in `0..10`.
fn base_texts(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Lcg(seed);
    (0..n).map(|_| (0..4 + rng.next() % 9).map(|_| rng.next() % 10).collect()).collect()
}

fn collect(model: &Transformer<B>, pooling: Pooling, texts_per_lang: usize) -> PooledActivations {
    let mut col = NeuronCollector::new(
        model,
        vec!["a".into(), "b".into(), "c".into()],
        CollectOptions { pooling, max_tokens: 10 },
    )
    .unwrap();
    for seq in base_texts(texts_per_lang, 99) {
        for lang in 0..3u32 {
            let ids: Vec<u32> = seq.iter().map(|&t| t + 10 * lang).collect();
            col.add_text(lang as usize, &ids).unwrap();
        }
    }
    col.finish().unwrap()
}

#[test]
fn planted_neuron_ranks_first_with_ap_one() {
    let model = planted_model();
    let layout = NeuronLayout::of_model(&model);
    // q 16 + k 8 + v 8 + o 16 + gate 32 + up 32 + down 16 = 128 per layer.
    assert_eq!(layout.num_neurons(), 256);
    let planted_index = 128 + 16 + 8 + 8 + 16 + PLANT_UNIT;
    for pooling in [Pooling::Mean, Pooling::Max] {
        let p = collect(&model, pooling, 12);
        assert_eq!(p.num_texts(), 36);
        let table = average_precision_table(&p, 2).unwrap();
        let report =
            analyze(&p, &table, &AnalysisOptions { top_n: 10, include_bottom: false, new_languages: vec!["a".into()] })
                .unwrap();
        let a = &report.languages[0];
        let first = &a.top[0];
        assert_eq!(
            (first.layer, first.component.as_str(), first.unit, first.index),
            (PLANT_LAYER, "gate_proj", PLANT_UNIT, planted_index),
            "{pooling:?}: top neuron {first:?}"
        );
        assert_eq!(first.ap, 1.0, "{pooling:?}");
        // Every other neuron ties A's texts with B's and C's: AP < 1. The
        // runner-up is the next neuron above the cut, or the AP the tied
        // neurons at the cut share.
        let runner_up = a.top.get(1).map(|n| n.ap).unwrap_or(a.top_cut.ap);
        assert!(runner_up < 1.0, "{pooling:?}: runner-up AP {runner_up} (cut {:?})", a.top_cut.ap);
        assert_eq!(a.top.len() + a.top_cut.slots, 10, "{pooling:?}: top-N places");
        // For B the planted neuron puts all of A (negatives) first, then B and
        // C tied pair by pair: a low AP, the same by both code paths.
        let pos_b: Vec<bool> = p.labels.iter().map(|&l| l == 1).collect();
        let ap_b = average_precision(&p.column(planted_index), &pos_b).unwrap();
        assert_eq!(table.ap[1][planted_index], ap_b);
        assert!(ap_b < 0.35, "AP(b) = {ap_b}");
        if pooling == Pooling::Mean {
            // Mean pooling: only the pairs (B_i, C_i) tie, so
            // AP = (1/12) * sum_k k / (12 + 2k).
            let want: f64 = (1..=12).map(|k| k as f64 / (12 + 2 * k) as f64).sum::<f64>() / 12.0;
            assert!((ap_b - want).abs() < 1e-12, "AP(b) = {ap_b} vs {want}");
        }
        // Base rates and counts.
        assert!((a.base_rate - 1.0 / 3.0).abs() < 1e-15);
        // Tie weights sum to the places they share (up to rounding).
        let s: f64 = report.union_counts.iter().map(|c| c.total).sum();
        assert!((s - 10.0).abs() < 1e-9, "{s}");
        let gate_slot = report.layout.layers[1].iter().position(|c| c.component == "gate_proj").unwrap();
        assert!(report.union_counts[1].per_component[gate_slot] >= 1.0);
        eprintln!("{pooling:?}: planted AP(a) = {}, runner-up AP = {runner_up:.4}", first.ap);
    }
}

#[test]
fn report_round_trips_and_allocates() {
    let model = planted_model();
    let p = collect(&model, Pooling::Mean, 6);
    let table = average_precision_table(&p, 1).unwrap();
    let report = analyze(
        &p,
        &table,
        &AnalysisOptions { top_n: 40, include_bottom: true, new_languages: vec!["b".into(), "c".into()] },
    )
    .unwrap();
    let json = serde_json::to_vec(&report).unwrap();
    let back = NeuronReport::from_json(&json, "neurons.json").unwrap();
    assert_eq!(back, report);
    // Union of b and c with bottom-N: distinct, at most 2 * 2 * 40.
    let s: Vec<f64> = report.union_counts.iter().map(|c| c.total).collect();
    assert!(s.iter().sum::<f64>() <= 160.0 && s.iter().sum::<f64>() >= 40.0);
    let cmp = compare_allocations(&report, None, ExpertRange::new(1, 6).unwrap(), Some(3)).unwrap();
    assert_eq!(cmp.neuronmoe, neuronmoe_allocation(&s, ExpertRange::new(1, 6).unwrap()).unwrap());
    assert_eq!(cmp.original_languages, vec!["a".to_string()]);
    assert_eq!(cmp.layermoe.as_ref().unwrap().len(), 2);
    for m in AllocationMethod::ALL {
        let f = cmp.file(m).unwrap();
        let text = serde_json::to_string(&f).unwrap();
        let counts = AllocationFile::parse(text.as_bytes(), "alloc.json").unwrap();
        let totals = counts.per_layer(2, "alloc.json").unwrap();
        let new = cmp.get(m).unwrap();
        assert_eq!(totals, new.iter().map(|&e| Some(e + 1)).collect::<Vec<_>>(), "{m:?}");
    }
    // Without an explicit count the uniform baseline has exactly NeuronMoE's
    // total, and so do the placement controls.
    let cmp = compare_allocations(&report, None, ExpertRange::new(1, 6).unwrap(), None).unwrap();
    let total: usize = cmp.neuronmoe.iter().sum();
    assert_eq!(cmp.uniform.iter().sum::<usize>(), total, "neuronmoe {:?} uniform {:?}", cmp.neuronmoe, cmp.uniform);
    assert!(cmp.uniform.iter().max().unwrap() - cmp.uniform.iter().min().unwrap() <= 1, "{:?}", cmp.uniform);
    for m in [AllocationMethod::Shuffled, AllocationMethod::Inverted, AllocationMethod::LayerMoePlaced] {
        let mut a = cmp.get(m).unwrap().to_vec();
        let mut b = cmp.neuronmoe.clone();
        a.sort();
        b.sort();
        assert_eq!(a, b, "{m:?} keeps NeuronMoE's counts");
    }
    // Every language new: no LayerMoE baseline, a clear error.
    let all: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
    let cmp = compare_allocations(&report, Some(&all), ExpertRange::new(1, 6).unwrap(), Some(3)).unwrap();
    let e = cmp.file(AllocationMethod::LayerMoe).unwrap_err().to_string();
    assert!(e.contains("original"), "{e}");
}

#[test]
fn bad_input_is_explained() {
    let model = planted_model();
    let two = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // A single language.
    let mut col = NeuronCollector::new(&model, two(&["a"]), CollectOptions::default()).unwrap();
    col.add_text(0, &[1, 2, 3]).unwrap();
    col.add_text(0, &[2, 3]).unwrap();
    let e = col.finish().unwrap_err().to_string();
    assert!(e.contains("at least 2 languages") && e.contains("`a`"), "{e}");
    // A language with one text.
    let mut col = NeuronCollector::new(&model, two(&["a", "b"]), CollectOptions::default()).unwrap();
    col.add_text(0, &[1, 2, 3]).unwrap();
    col.add_text(0, &[2, 3]).unwrap();
    col.add_text(1, &[12, 13]).unwrap();
    let e = col.finish().unwrap_err().to_string();
    assert!(e.contains("language `b` has 1 text(s)") && e.contains("at least 2"), "{e}");
    // An empty text, an unknown language, no languages, a repeated one, max_tokens 0.
    let mut col = NeuronCollector::new(&model, two(&["a", "b"]), CollectOptions::default()).unwrap();
    let e = col.add_text(0, &[]).unwrap_err().to_string();
    assert!(e.contains("empty text") && e.contains("`a`"), "{e}");
    assert!(col.add_text(2, &[1]).unwrap_err().to_string().contains("out of range"));
    assert!(NeuronCollector::new(&model, vec![], CollectOptions::default()).is_err());
    let e = NeuronCollector::new(&model, two(&["a", "a"]), CollectOptions::default()).err().unwrap().to_string();
    assert!(e.contains("given twice"), "{e}");
    let e = NeuronCollector::new(&model, two(&["a", "b"]), CollectOptions { pooling: Pooling::Mean, max_tokens: 0 })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("max_tokens"), "{e}");
    // top_n out of range, unknown new language.
    let p = collect(&model, Pooling::Mean, 3);
    let table = average_precision_table(&p, 1).unwrap();
    let e = analyze(&p, &table, &AnalysisOptions { top_n: 0, ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains("top_n"), "{e}");
    let e = analyze(&p, &table, &AnalysisOptions { top_n: 5, include_bottom: false, new_languages: two(&["xx"]) })
        .unwrap_err()
        .to_string();
    assert!(e.contains("`xx` was not analysed"), "{e}");
    // E_min > E_max.
    let e = ExpertRange::new(6, 1).unwrap_err().to_string();
    assert!(e.contains("E_min (6) is greater than E_max (1)"), "{e}");
    // Non-finite scores.
    let mut bad = p.clone();
    bad.data[5] = f32::NAN;
    let e = average_precision_table(&bad, 1).unwrap_err().to_string();
    assert!(e.contains("non-finite") && e.contains("text 0"), "{e}");
}

/// Dumps real SmolLM2 pooled activations (mean and max) of a few neurons
/// for `tests/reference/make_ap_golden.py`: set `MOE_STUDIO_DUMP=FILE`.
#[test]
#[ignore = "writes the input of tests/reference/make_ap_golden.py (needs SmolLM2 and the corpora)"]
fn dump_real_scores() {
    let out = std::env::var("MOE_STUDIO_DUMP").expect("set MOE_STUDIO_DUMP=FILE");
    let Some(gguf) = common::smollm2_gguf() else { return };
    let m = moe_shared::checkpoint::open_model(&gguf).unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let model = moe_shared::model::load_model::<B>(&m, &Default::default()).unwrap();
    let langs = ["en", "hu", "el", "tr", "sr", "bn"];
    let per_lang = 20;
    let mut texts = Vec::new();
    for (i, code) in langs.iter().enumerate() {
        let f = common::data_file(&format!("corpora/lang/{code}/valid.txt")).unwrap();
        let s = std::fs::read_to_string(f).unwrap();
        for line in s.lines().map(str::trim).filter(|l| !l.is_empty()).take(per_lang) {
            texts.push((i, tok.encode(line, true).unwrap()));
        }
    }
    let layout = NeuronLayout::of_model(&model);
    let segs = layout.segments();
    // A few neurons across depth and components.
    let mut picks = Vec::new();
    for &(layer, slot, unit) in &[
        (0, 0, 3),
        (0, 4, 17),
        (0, 6, 100),
        (7, 1, 5),
        (12, 5, 900),
        (15, 3, 42),
        (20, 2, 64),
        (24, 4, 1000),
        (29, 5, 7),
        (29, 6, 300),
    ] {
        let s = segs.iter().find(|s| s.1 == layer && s.2 == slot).unwrap();
        picks.push((s.0 + unit, layer, layout.layers[layer][slot].component.clone(), unit));
    }
    let mut pooling = serde_json::Map::new();
    let mut labels = Vec::new();
    for (name, how) in [("mean", Pooling::Mean), ("max", Pooling::Max)] {
        let mut col = NeuronCollector::new(
            &model,
            langs.iter().map(|s| s.to_string()).collect(),
            CollectOptions { pooling: how, max_tokens: 64 },
        )
        .unwrap();
        for (i, ids) in &texts {
            col.add_text(*i, ids).unwrap();
        }
        let p = col.finish().unwrap();
        labels = p.labels.clone();
        let neurons: Vec<serde_json::Value> = picks
            .iter()
            .map(|(idx, l, c, u)| serde_json::json!({"index": idx, "layer": l, "component": c, "unit": u}))
            .collect();
        let scores: Vec<Vec<f32>> = picks.iter().map(|(idx, ..)| p.column(*idx)).collect();
        pooling.insert(name.into(), serde_json::json!({"neurons": neurons, "scores": scores}));
    }
    let d = serde_json::json!({
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "max_tokens": 64,
        "languages": langs,
        "labels": labels,
        "pooling": pooling,
    });
    std::fs::write(&out, serde_json::to_string(&d).unwrap()).unwrap();
    eprintln!("wrote {out}");
}
