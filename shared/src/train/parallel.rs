//! Data parallelism inside one process: `train --devices N` runs N
//! replicas as threads, summed by Burn's collective *local* all-reduce
//! (`burn-collective` 0.21). Several machines are not this module's: they
//! run the emitted PyTorch FSDP2 job under torchrun
//! (backend/src/cli/torch_handoff.rs, docs/scaling.md).
//!
//! Every collective call here is an all-reduce (sum). Per optimizer step
//! each replica (docs/methods.md §1-2, the trainer in [`super::trainer`]):
//! 1. per micro-step, all-reduces its per-expert routing counts and its
//!    number of original-language rows before the losses, so that the
//!    load-balancing fractions `f_i` and the language prior's denominator
//!    are those of the whole global batch
//!    ([`super::losses::load_balancing_loss_dp`],
//!    [`super::losses::language_prior_loss_dp`]);
//! 2. accumulates its gradients over the micro-steps, then sums them over
//!    the replicas with Burn's `GradientsParams::all_reduce` (in `ParamId`
//!    order; the losses are scaled by `1 / (grad_accum * world)`, so the
//!    sum is the mean); a parameter that got no gradient on some replica
//!    (an expert no token of its share chose) is sent as zeros, and dropped
//!    after the reduction when no replica had one, exactly as one replica
//!    with the whole batch would leave it;
//! 3. all-reduces its loss terms for the metrics.
//!
//! Every replica then clips and steps the same gradients with the same
//! AdamW state, so the replicas stay bit-identical without broadcasting
//! weights.
//!
//! Burn keeps ONE local collective server per process and backend type, so
//! one [`Cluster`] exists at a time per process (a second waits).

use std::sync::{Condvar, Mutex, MutexGuard};

use burn::collective::{self as bc, AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::error::{Result, StudioError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One cluster at a time per process (Burn's local server is a process
/// global keyed by backend type).
static SLOT: Mutex<bool> = Mutex::new(false);
static SLOT_FREE: Condvar = Condvar::new();

struct SlotGuard;

impl SlotGuard {
    fn acquire() -> SlotGuard {
        let mut busy = lock(&SLOT);
        while *busy {
            busy = SLOT_FREE.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy = true;
        SlotGuard
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        *lock(&SLOT) = false;
        SLOT_FREE.notify_one();
    }
}

fn collective_err(what: &str, e: bc::CollectiveError) -> StudioError {
    StudioError::Invalid(format!("data parallelism: {what} failed in Burn's collective ({e:?})"))
}

/// The data-parallel replicas of this process: one Burn local collective
/// peer (a thread) per device. `B` is the INNER (non-autodiff) backend,
/// whose tensors the gradients are.
pub struct Cluster<B: Backend> {
    /// Burn's local peers `0..devices`.
    peers: Vec<PeerId>,
    devices: Vec<B::Device>,
    _slot: SlotGuard,
}

impl<B: Backend> std::fmt::Debug for Cluster<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("peers", &self.peers).finish()
    }
}

impl<B: Backend> Cluster<B> {
    /// Registers one Burn local peer per device (concurrently: Burn answers
    /// when all have registered), waiting while another cluster of this
    /// process holds Burn's local server.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when Burn refuses the registration.
    pub fn join(devices: Vec<B::Device>) -> Result<Self> {
        let local = devices.len().max(1);
        let slot = SlotGuard::acquire();
        let config = CollectiveConfig::default()
            .with_num_devices(local)
            .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
        let peers: Vec<PeerId> = (0..local).map(|i| PeerId::from(i as u32)).collect();
        let results: Vec<std::thread::Result<std::result::Result<(), bc::CollectiveError>>> = std::thread::scope(|s| {
            let hs: Vec<_> = peers
                .iter()
                .zip(&devices)
                .map(|(p, d)| {
                    let (p, d, c) = (*p, d.clone(), config.clone());
                    s.spawn(move || bc::register::<B>(p, d, c))
                })
                .collect();
            hs.into_iter().map(|h| h.join()).collect()
        });
        for r in results {
            r.map_err(|_| StudioError::Invalid("a collective registration panicked".into()))?
                .map_err(|e| collective_err("registering the replicas", e))?;
        }
        Ok(Cluster { peers, devices, _slot: slot })
    }

    /// Replicas (devices) in the run.
    pub fn world(&self) -> usize {
        self.devices.len().max(1)
    }

    /// Sum of `values` over all replicas, called by replica `i` (every
    /// replica must call it, in the same order, with a vector of the same
    /// length): Burn's local all-reduce. Exact for integers below 2^24.
    ///
    /// # Errors
    /// Burn's collective errors.
    pub fn all_reduce_sum(&self, i: usize, values: &[f32]) -> Result<Vec<f32>> {
        let t = Tensor::<B, 1>::from_data(TensorData::new(values.to_vec(), [values.len()]), &self.devices[i]);
        let r = bc::all_reduce::<B>(self.peers[i], t.into_primitive().tensor(), ReduceOperation::Sum)
            .map_err(|e| collective_err("an all-reduce", e))?;
        Ok(Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(r))
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32"))
    }

    /// Sums `grads` over the replicas, called by replica `i` (Burn's
    /// `GradientsParams::all_reduce`, in `ParamId` order: every replica must
    /// hold the same parameter ids).
    ///
    /// # Errors
    /// Burn's collective errors.
    pub fn all_reduce_grads(&self, i: usize, grads: GradientsParams) -> Result<GradientsParams> {
        grads
            .all_reduce::<B>(self.peers[i], ReduceOperation::Sum)
            .map_err(|e| collective_err("the gradient all-reduce", e))
    }
}

impl<B: Backend> Drop for Cluster<B> {
    fn drop(&mut self) {
        for p in &self.peers {
            let _ = bc::finish_collective::<B>(*p);
        }
    }
}
