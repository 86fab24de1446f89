//! Checkpoint + resume: a run interrupted by the stop flag and resumed from
//! its checkpoint gives exactly the loss curve of an uninterrupted run with
//! the same seed (stories260K upcycled, stage `experts`, gradient
//! accumulation 2, periodic checkpoints).

use crate::train_util;

use std::sync::atomic::{AtomicBool, Ordering};

use burn::backend::Autodiff;
use moe_shared::model::load_model;
use moe_shared::train::checkpoint::latest_checkpoint;
use moe_shared::train::{RunOutcome, Stage, TrainConfig, Trainer};
use moe_shared::CpuBackend;

type A = Autodiff<CpuBackend>;

#[test]
fn resumed_run_repeats_the_uninterrupted_loss_curve() {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let moe = train_util::upcycled(&dense, dir.path(), 0.1);
    let device = Default::default();
    let config = TrainConfig {
        steps: 6,
        seq_len: 32,
        batch_size: 2,
        grad_accum: 2,
        lr: 3e-3,
        warmup: 2,
        save_every: 2,
        keep: 2,
        seed: 42,
        ..TrainConfig::new(Stage::Experts)
    };
    let data = || train_util::hu_en(&tok, 32, true, 42).unwrap();
    let never = AtomicBool::new(false);

    // Uninterrupted.
    let full_out = dir.path().join("full");
    let mut t =
        Trainer::new(load_model::<A>(&moe, &device).unwrap(), data(), config.clone(), vec![device], "moe").unwrap();
    let mut full = Vec::new();
    let outcome = t.run(&full_out, &never, |m| full.push(m.loss)).unwrap();
    assert_eq!(outcome, RunOutcome::Finished(full_out.join("final")));
    let mut kept: Vec<String> =
        std::fs::read_dir(&full_out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    kept.sort();
    assert_eq!(kept, vec!["checkpoint-000002", "checkpoint-000004", "final"]);

    // Interrupted after 3 steps (the stop flag, as Ctrl-C sets it), then resumed.
    let out = dir.path().join("split");
    let stop = AtomicBool::new(false);
    let mut t =
        Trainer::new(load_model::<A>(&moe, &device).unwrap(), data(), config.clone(), vec![device], "moe").unwrap();
    let mut first = Vec::new();
    let outcome = t
        .run(&out, &stop, |m| {
            first.push(m.loss);
            if m.step == 3 {
                stop.store(true, Ordering::SeqCst);
            }
        })
        .unwrap();
    drop(t);
    let RunOutcome::Stopped { step: 3, checkpoint: Some(ck) } = outcome else { panic!("{outcome:?}") };
    assert_eq!(latest_checkpoint(&out).unwrap(), (3, ck.clone()));
    let mut t = Trainer::<A>::resume(&ck, data(), config.clone(), vec![device]).unwrap();
    assert_eq!(t.step_count(), 3);
    let mut rest = Vec::new();
    t.run(&out, &never, |m| rest.push(m.loss)).unwrap();
    let resumed: Vec<f64> = first.iter().chain(&rest).copied().collect();
    eprintln!("uninterrupted {full:?}\nresumed       {resumed:?}");
    assert_eq!(resumed, full, "same losses, bit for bit");

    // Resuming with other options is refused and says which.
    let other = TrainConfig { lr: 1e-3, ..config.clone() };
    let e = Trainer::<A>::resume(&ck, data(), other, vec![device]).err().unwrap().to_string();
    assert!(e.contains("lr"), "{e}");
    // ... and so is other data.
    let e = Trainer::<A>::resume(&ck, train_util::hu_en(&tok, 32, false, 42).unwrap(), config, vec![device])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("same --data"), "{e}");
}

/// A damaged checkpoint (its `trainer_state.json` unreadable, as after a
/// power cut or a copy cut short) is never resumed from and is listed by
/// `unreadable_checkpoints`; the resumed run replaces a damaged directory
/// of a step it saves again and prunes damaged ones of earlier steps; a
/// `final.old` left by a stop while `final` was re-saved is resumable.
#[test]
fn damaged_checkpoints_are_skipped_replaced_and_pruned() {
    use moe_shared::train::checkpoint::{list_checkpoints, read_state, unreadable_checkpoints};
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let moe = train_util::upcycled(&dense, dir.path(), 0.1);
    let device = Default::default();
    let config = TrainConfig {
        steps: 8,
        seq_len: 32,
        batch_size: 2,
        lr: 3e-3,
        warmup: 1,
        save_every: 2,
        keep: 2,
        seed: 7,
        ..TrainConfig::new(Stage::Experts)
    };
    let data = || train_util::hu_en(&tok, 32, true, 7).unwrap();
    let out = dir.path().join("run");
    let stop = AtomicBool::new(false);
    let mut t =
        Trainer::new(load_model::<A>(&moe, &device).unwrap(), data(), config.clone(), vec![device], "moe").unwrap();
    t.run(&out, &stop, |m| {
        if m.step == 4 {
            stop.store(true, Ordering::SeqCst);
        }
    })
    .unwrap();
    drop(t);
    let names = |out: &std::path::Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&out), vec!["checkpoint-000002", "checkpoint-000004"]);
    // Step 4's state cut short; a damaged directory of an earlier step beside it.
    let state = out.join("checkpoint-000004").join("trainer_state.json");
    let raw = std::fs::read(&state).unwrap();
    std::fs::write(&state, &raw[..raw.len() / 2]).unwrap();
    std::fs::create_dir(out.join("checkpoint-000001")).unwrap();
    assert_eq!(latest_checkpoint(&out).unwrap().0, 2, "the damaged step 4 is not resumed from");
    // Not checkpoints: a user's directory whose name only starts like one.
    std::fs::create_dir(out.join("checkpoint-000001-notes")).unwrap();
    let bad: Vec<_> = unreadable_checkpoints(&out).into_iter().map(|u| (u.dir, u.damaged)).collect();
    assert_eq!(bad, vec![(out.join("checkpoint-000001"), true), (out.join("checkpoint-000004"), true)]);

    let (_, ck) = latest_checkpoint(&out).unwrap();
    let mut t = Trainer::<A>::resume(&ck, data(), config.clone(), vec![device]).unwrap();
    t.run(&out, &AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!(names(&out), vec!["checkpoint-000001-notes", "checkpoint-000004", "checkpoint-000006", "final"]);
    assert_eq!(read_state(&out.join("checkpoint-000004")).unwrap().step, 4, "step 4 saved again, whole");
    assert!(unreadable_checkpoints(&out).is_empty());

    // A stop while `final` was re-saved leaves `final.old`: still a checkpoint, resumable.
    std::fs::rename(out.join("final"), out.join("final.old")).unwrap();
    assert_eq!(latest_checkpoint(&out).unwrap(), (8, out.join("final.old")));
    assert_eq!(list_checkpoints(&out).len(), 3);

    // A damaged `final` beside it (a stop while it was written by an older build): the run
    // resumed from `final.old` replaces the damaged one, and only then removes `final.old`.
    std::fs::create_dir(out.join("final")).unwrap();
    let (_, ck) = latest_checkpoint(&out).unwrap();
    assert_eq!(ck, out.join("final.old"));
    let mut t = Trainer::<A>::resume(&ck, data(), config.clone(), vec![device]).unwrap();
    t.run(&out, &AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!(read_state(&out.join("final")).unwrap().step, 8);
    assert!(!out.join("final.old").exists());

    // A state this build cannot read but that is whole JSON (a newer build's, say) is not
    // damage: the run refuses to overwrite it rather than remove it.
    let st = out.join("checkpoint-000006").join("trainer_state.json");
    std::fs::write(&st, br#"{"format": "moe-studio-trainer-state", "version": 99}"#).unwrap();
    let u = unreadable_checkpoints(&out);
    assert_eq!(u.len(), 1);
    assert!(!u[0].damaged, "{:?}", u[0].error);
}
