//! Times the same SmolLM2 workloads on burn-flex and burn-ndarray (whichever
//! feature set this binary was built with), through the studio's own model
//! code, and prints one JSON line per measurement.
//!
//! Usage: backend-cmp BACKEND WORKLOAD MODEL [REPEAT]
//!   BACKEND  flex | ndarray
//!   WORKLOAD prefill (512 tokens, all logits) | generate (32-token prompt,
//!            64 new tokens, KV cache, greedy) | train (upcycled 4 experts
//!            top-2, experts stage, 4 x 256, AdamW; MODEL is the upcycled dir)
//!            | upcycle (writes MODEL's 4-expert upcycle into the dir given
//!            as REPEAT)

use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::open_model;
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::generate::{generate, Sampling};
use moe_shared::methods::{upcycle, ExpertCounts, RouterInit, UpcycleOptions};
use moe_shared::model::load_model;
use moe_shared::train::{devices, DataSpec, Mixture, PackedSource, Stage, TrainConfig, Trainer};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn prefill<B: Backend>(path: &str, repeat: usize) -> (f64, Vec<f64>) {
    let device = B::Device::default();
    let m = open_model(path.as_ref()).unwrap();
    let model = load_model::<B>(&m, &device).unwrap();
    let n = 512;
    let ids: Vec<i64> = (0..n).map(|i| ((i * 7919 + 13) % m.config.vocab_size) as i64).collect();
    let once = || {
        let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [1, n]), &device);
        let _ = model.forward(t, None).into_data();
    };
    once();
    let times: Vec<f64> = (0..repeat)
        .map(|_| {
            let t0 = Instant::now();
            once();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    (n as f64 / median(times.clone()), times)
}

fn gen<B: Backend>(path: &str, repeat: usize) -> (f64, Vec<f64>) {
    let device = B::Device::default();
    let m = open_model(path.as_ref()).unwrap();
    let model = load_model::<B>(&m, &device).unwrap();
    let prompt: Vec<u32> = (0..32).map(|i| ((i * 7919 + 13) % m.config.vocab_size) as u32).collect();
    let once = || generate(&model, &prompt, 64, Sampling::default(), None, &device).unwrap();
    once();
    let times: Vec<f64> = (0..repeat)
        .map(|_| {
            let t0 = Instant::now();
            once();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    (64.0 / median(times.clone()), times)
}

fn train<B: AutodiffBackend>(path: &str, repeat: usize) -> (f64, Vec<f64>) {
    let m = open_model(path.as_ref()).unwrap();
    let v = m.config.vocab_size;
    let device = devices::<B>(1);
    let model = load_model::<B>(&m, &device[0]).unwrap();
    let (batch, seq) = (4, 256);
    let total = (repeat + 1) * batch * seq + 1;
    let ids: Vec<u32> = (0..total).map(|j| ((j * 7919 + 13) % v) as u32).collect();
    let spec = DataSpec { name: "synthetic".into(), path: "-".into(), weight: 1.0, original: false };
    let data = Mixture::new(vec![PackedSource::new(spec, ids, seq).unwrap()], 0).unwrap();
    let config = TrainConfig {
        steps: repeat + 1,
        seq_len: seq,
        batch_size: batch,
        lr: 5e-5,
        warmup: 0,
        ..TrainConfig::new(Stage::Experts)
    };
    let mut t = Trainer::new(model, data, config, device, &m.path).unwrap();
    t.step().unwrap();
    let times: Vec<f64> = (0..repeat)
        .map(|_| {
            let t0 = Instant::now();
            t.step().unwrap();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    ((batch * seq) as f64 / median(times.clone()), times)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (backend, workload, model) = (a[1].as_str(), a[2].as_str(), a[3].as_str());
    if workload == "upcycle" {
        let m = open_model(model.as_ref()).unwrap();
        let opts = UpcycleOptions {
            experts: ExpertCounts::Uniform(4),
            top_k: 2,
            router_init: RouterInit::Random { std: 0.02 },
            dtype: Some(DType::F32),
            ..Default::default()
        };
        upcycle(m.source.as_ref(), &m.config, &opts, a[4].as_ref(), None, WriteOptions::default()).unwrap();
        return;
    }
    let repeat: usize = a.get(4).map(|s| s.parse().unwrap()).unwrap_or(3);
    type F = burn::backend::Flex;
    type N = burn::backend::NdArray<f32>;
    let (tps, times) = match (backend, workload) {
        ("flex", "prefill") => prefill::<F>(model, repeat),
        ("ndarray", "prefill") => prefill::<N>(model, repeat),
        ("flex", "generate") => gen::<F>(model, repeat),
        ("ndarray", "generate") => gen::<N>(model, repeat),
        ("flex", "train") => train::<Autodiff<F>>(model, repeat),
        ("ndarray", "train") => train::<Autodiff<N>>(model, repeat),
        other => panic!("unknown {other:?}"),
    };
    let build = if cfg!(feature = "nd-blas") {
        "nd-blas"
    } else if cfg!(feature = "nd-mt") {
        "nd-mt"
    } else {
        "nd-plain"
    };
    println!(
        "{{\"build\":\"{build}\",\"backend\":\"{backend}\",\"workload\":\"{workload}\",\"tokens_per_s\":{tps:.2},\"times\":{times:?}}}"
    );
}
