//! AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
//! ICLR 2019, Algorithm 2) as Burn 0.21's `AdamW` computes it, with one
//! fused, threaded, in-place pass per parameter on the CPU backend
//! (docs/methods.md, "Training"; docs/benchmarks.md, "Where the time goes").
//!
//! Per parameter `p` with gradient `g` at step `t` (f32 throughout):
//!
//! ```text
//! m = m * b1 + g * (1 - b1)          (first step: m = g * (1 - b1))
//! v = v * b2 + (g * g) * (1 - b2)    (first step: v = (g * g) * (1 - b2))
//! u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//! p = p * (1 - lr * wd) - u * lr     (p - u * lr when lr * wd = 0)
//! ```
//!
//! Burn's `AdamW` runs this as about fourteen separate single-threaded
//! tensor operations, several of which allocate a parameter-sized buffer;
//! over the 239 M trainable parameters of an upcycled SmolLM2 that is
//! tens of GB of memory traffic per step. [`StudioAdamW`] evaluates the
//! same expression element by element in the same order (no fused
//! multiply-add, so every result is bit-identical to Burn's) in one pass
//! over `p, g, m, v`, reusing their buffers, split over the rayon threads.
//! Its state is Burn's [`AdamWState`], so `optimizer.bin` files written
//! before (Burn's `AdamW` record) load unchanged and vice versa.
//!
//! Other backends (GPU) and other dtypes run the same expression as Burn
//! tensor operations on the device.

use std::any::TypeId;

use burn::optim::{AdamWState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn::tensor::{backend::Backend, DType, Tensor, TensorData};

/// AdamW hyper-parameters (`beta_1`, `beta_2`, `epsilon`, decoupled
/// `weight_decay`); the learning rate comes with each step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StudioAdamW {
    /// Exponential decay of the first moment.
    pub beta_1: f32,
    /// Exponential decay of the second moment.
    pub beta_2: f32,
    /// Added to the denominator.
    pub epsilon: f32,
    /// Decoupled weight decay (multiplied by the learning rate).
    pub weight_decay: f32,
}

impl StudioAdamW {
    /// Scalars of step `time` (1-based) at learning rate `lr`.
    fn scalars(&self, lr: LearningRate, time: usize) -> Scalars {
        let decay_rate = lr * self.weight_decay as f64;
        Scalars {
            b1: self.beta_1,
            b2: self.beta_2,
            f1: 1.0 - self.beta_1,
            f2: 1.0 - self.beta_2,
            c1: 1.0 - self.beta_1.powi(time as i32),
            c2: 1.0 - self.beta_2.powi(time as i32),
            eps: self.epsilon,
            keep: (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32),
            lr: lr as f32,
        }
    }
}

#[derive(Clone, Copy)]
struct Scalars {
    b1: f32,
    b2: f32,
    f1: f32,
    f2: f32,
    c1: f32,
    c2: f32,
    eps: f32,
    keep: Option<f32>,
    lr: f32,
}

/// Elements per task of the fused pass (256 KiB of each operand; native
/// only: wasm32 runs one pass on its single thread).
#[cfg(not(target_arch = "wasm32"))]
const CHUNK: usize = 64 * 1024;

/// The fused update of one contiguous run of elements; `first`: no moments
/// yet (they are written, not read).
fn update(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: Scalars, first: bool) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        if first {
            *m = g * s.f1;
            *v = (g * g) * s.f2;
        } else {
            *m = *m * s.b1 + g * s.f1;
            *v = *v * s.b2 + (g * g) * s.f2;
        }
        let u = (*m / s.c1) / ((*v / s.c2).sqrt() + s.eps);
        let decayed = match s.keep {
            Some(k) => *p * k,
            None => *p,
        };
        *p = decayed - u * s.lr;
    }
}

fn f32s_mut(d: &mut TensorData) -> &mut [f32] {
    d.as_mut_slice::<f32>().expect("an f32 tensor's data is f32")
}

impl<B: Backend> SimpleOptimizer<B> for StudioAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    /// One AdamW step of `tensor` (any shape) with `grad` (same shape).
    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let time = state.as_ref().map(|s| s.momentum.time).unwrap_or(0) + 1;
        let s = self.scalars(lr, time);
        let moments = state.map(|s| (s.momentum.moment_1, s.momentum.moment_2));
        let host = TypeId::of::<B>() == TypeId::of::<crate::CpuBackend>()
            && tensor.dtype() == DType::F32
            && grad.dtype() == DType::F32
            && moments.as_ref().is_none_or(|(m, v)| m.dtype() == DType::F32 && v.dtype() == DType::F32);
        let (p, m, v) = if host { fused(tensor, grad, moments, s) } else { by_ops(tensor, grad, moments, s) };
        (p, Some(AdamWState::new(AdaptiveMomentumState::new(time, m, v))))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum.moment_1 = state.momentum.moment_1.to_device(device);
        state.momentum.moment_2 = state.momentum.moment_2.to_device(device);
        state
    }
}

type Triple<B, const D: usize> = (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>);

/// The host pass: on the CPU backend `into_data` hands over the buffers
/// of unique contiguous tensors (a copy otherwise), which are updated in
/// place and handed back.
fn fused<B: Backend, const D: usize>(
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
    s: Scalars,
) -> Triple<B, D> {
    let device = tensor.device();
    let shape = tensor.shape();
    let n = shape.num_elements();
    let first = moments.is_none();
    let mut p = tensor.into_data();
    let g = grad.into_data();
    let (mut m, mut v) = match moments {
        Some((m, v)) => (m.into_data(), v.into_data()),
        None => (TensorData::new(vec![0f32; n], shape.clone()), TensorData::new(vec![0f32; n], shape.clone())),
    };
    {
        let (ps, ms, vs) = (f32s_mut(&mut p), f32s_mut(&mut m), f32s_mut(&mut v));
        let gs = g.as_slice::<f32>().expect("an f32 tensor's data is f32");
        assert!(ps.len() == n && gs.len() == n && ms.len() == n && vs.len() == n, "AdamW: operands of {n} elements");
        #[cfg(not(target_arch = "wasm32"))]
        {
            use rayon::prelude::*;
            ps.par_chunks_mut(CHUNK)
                .zip(gs.par_chunks(CHUNK))
                .zip(ms.par_chunks_mut(CHUNK))
                .zip(vs.par_chunks_mut(CHUNK))
                .for_each(|(((p, g), m), v)| update(p, g, m, v, s, first));
        }
        #[cfg(target_arch = "wasm32")]
        update(ps, gs, ms, vs, s, first);
    }
    (Tensor::from_data(p, &device), Tensor::from_data(m, &device), Tensor::from_data(v, &device))
}

/// The same expression as device tensor operations (GPU backends).
fn by_ops<B: Backend, const D: usize>(
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
    s: Scalars,
) -> Triple<B, D> {
    let (m, v) = match moments {
        Some((m, v)) => (
            m.mul_scalar(s.b1).add(grad.clone().mul_scalar(s.f1)),
            v.mul_scalar(s.b2).add(grad.square().mul_scalar(s.f2)),
        ),
        None => (grad.clone().mul_scalar(s.f1), grad.square().mul_scalar(s.f2)),
    };
    let u = m.clone().div_scalar(s.c1).div(v.clone().div_scalar(s.c2).sqrt().add_scalar(s.eps));
    let decayed = match s.keep {
        Some(k) => tensor.mul_scalar(k),
        None => tensor,
    };
    (decayed - u.mul_scalar(s.lr), m, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::optim::{AdamWConfig, GradientsParams, Optimizer};

    type B = burn::backend::Autodiff<crate::CpuBackend>;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(777);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32) - 0.5
            })
            .collect()
    }

    /// Three steps with the gradient of `sum(w * c)` (`c` fixed, so `g = c`
    /// and the moments differ from step to step through the bias terms) and
    /// a varying learning rate: bit-identical to Burn's `AdamW`, through the
    /// fused host pass (more elements than one chunk) and through the
    /// tensor-op path.
    #[test]
    fn bit_identical_to_burn_adamw() {
        let dev = Default::default();
        let (rows, cols) = (300, 700); // 210k elements: several CHUNKs
        let start = values(rows * cols, 1);
        let c = Tensor::<B, 2>::from_data(TensorData::new(values(rows * cols, 2), [rows, cols]), &dev);
        // A one-parameter module (a Linear without bias) to step.
        let make = || burn::nn::Linear::<B> {
            weight: Param::from_tensor(Tensor::from_data(TensorData::new(start.clone(), [rows, cols]), &dev)),
            bias: None,
        };
        let cfg = AdamWConfig::new().with_beta_1(0.9).with_beta_2(0.95).with_epsilon(1e-8).with_weight_decay(0.1);
        let mut burn_opt = cfg.init::<B, burn::nn::Linear<B>>();
        let ours = StudioAdamW { beta_1: 0.9, beta_2: 0.95, epsilon: 1e-8, weight_decay: 0.1 };
        let mut our_opt = burn::optim::adaptor::OptimizerAdaptor::<StudioAdamW, burn::nn::Linear<B>, B>::from(ours);
        let (mut a, mut b) = (make(), make());
        for (step, lr) in [3e-3, 1e-3, 5e-4].into_iter().enumerate() {
            let ga = GradientsParams::from_grads::<B, _>((a.weight.val() * c.clone()).sum().backward(), &a);
            a = burn_opt.step(lr, a, ga);
            let gb = GradientsParams::from_grads::<B, _>((b.weight.val() * c.clone()).sum().backward(), &b);
            b = our_opt.step(lr, b, gb);
            let (wa, wb) = (
                a.weight.val().into_data().to_vec::<f32>().unwrap(),
                b.weight.val().into_data().to_vec::<f32>().unwrap(),
            );
            let differ = wa.iter().zip(&wb).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(differ, 0, "step {}: {differ} of {} weights differ from Burn's AdamW", step + 1, wa.len());
            assert!(wa != start, "step {}: the weights did not change", step + 1);
        }
        // The tensor-op path (what GPU backends run) on the inner backend.
        let s = ours.scalars(1e-3, 1);
        let g = c.clone().inner();
        let p0 = Tensor::<crate::CpuBackend, 2>::from_data(TensorData::new(start.clone(), [rows, cols]), &dev);
        let (p_ops, m_ops, _) = by_ops(p0.clone(), g.clone(), None, s);
        let (p_fused, m_fused, _) = fused(p0, g, None, s);
        for (x, y) in [(p_ops, p_fused), (m_ops, m_fused)] {
            let (x, y) = (x.into_data().to_vec::<f32>().unwrap(), y.into_data().to_vec::<f32>().unwrap());
            assert!(x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()), "tensor-op path differs from the fused");
        }
    }
}
