//! Data parallelism (`--devices`): two workers with 2 sequences each follow
//! the same loss curve as one worker with the 4 sequences (dense stage, so
//! no batch-dependent load-balancing term), up to float summation order.

use crate::train_util;

use burn::backend::Autodiff;
use moe_shared::model::load_model;
use moe_shared::train::{devices, Stage, TrainConfig, Trainer};
use moe_shared::CpuBackend;

type A = Autodiff<CpuBackend>;

#[test]
fn two_workers_match_one_worker_with_the_whole_batch() {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let run = |n_dev: usize, batch: usize| -> Vec<f64> {
        let data = train_util::hu_en(&tok, 32, true, 9).unwrap();
        let config = TrainConfig {
            steps: 4,
            seq_len: 32,
            batch_size: batch,
            devices: n_dev,
            lr: 1e-3,
            warmup: 0,
            ..TrainConfig::new(Stage::Dense)
        };
        let devs = devices::<A>(n_dev);
        let model = load_model::<A>(&dense, &devs[0]).unwrap();
        let mut t = Trainer::new(model, data, config, devs, "stories260K").unwrap();
        (0..4).map(|_| t.step().unwrap().loss).collect()
    };
    let one = run(1, 4);
    let two = run(2, 2);
    eprintln!("1 device x 4: {one:?}\n2 devices x 2: {two:?}");
    for (a, b) in one.iter().zip(&two) {
        assert!((a - b).abs() < 1e-4 * a.abs(), "{a} vs {b}");
    }
}
