//! Tests of [`super`]'s fused kernels against Burn's composed ops on the same values.

use super::*;
use burn::module::Param;
use burn::tensor::TensorData;

use crate::model::cpu_attention::tests::values;

type A = CpuAutodiff;

fn leaf<const D: usize>(dims: [usize; D], seed: u32) -> Tensor<A, D> {
    let n = dims.iter().product();
    Tensor::<A, D>::from_data(TensorData::new(values(n, seed), dims), &Default::default()).require_grad()
}

fn vec_of<const D: usize>(t: Tensor<CpuBackend, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0f32, f32::max)
}

/// `Σ y * r` for a fixed random `r`, the scalar whose gradient is `r`'s
/// vector-Jacobian product.
fn probe<const D: usize>(y: Tensor<A, D>, seed: u32) -> Tensor<A, 1> {
    let r = Tensor::<A, D>::from_data(TensorData::new(values(y.shape().num_elements(), seed), y.dims()), &y.device());
    (y * r).sum()
}

#[test]
fn gated_product_gradients_equal_burns_composition() {
    for act in [GateActivation::Silu, GateActivation::GeluTanh] {
        let (g, u) = (leaf([3, 40, 700], 1), leaf([3, 40, 700], 2));
        let fused = gated_product(g.clone(), u.clone(), act).unwrap_or_else(|_| panic!("the fused path"));
        let a = match act {
            GateActivation::Silu => burn::tensor::activation::silu(g.clone()),
            GateActivation::GeluTanh => burn::tensor::activation::gelu_approximate(g.clone()),
        };
        let composed = a * u.clone();
        assert!(worst(&vec_of(fused.clone().inner()), &vec_of(composed.clone().inner())) < 1e-6, "{act:?} forward");
        let gf = probe(fused, 9).backward();
        let gc = probe(composed, 9).backward();
        for (name, t) in [("gate", &g), ("up", &u)] {
            let (a, b) = (vec_of(t.grad(&gf).unwrap()), vec_of(t.grad(&gc).unwrap()));
            let e = worst(&a, &b);
            assert!(e < 2e-5, "{act:?} d{name}: max relative error {e}");
        }
    }
}

#[test]
fn rms_norm_gradients_equal_burns_composition() {
    let dev = Default::default();
    let mut norm = burn::nn::RmsNormConfig::new(576).with_epsilon(1e-5).init::<A>(&dev);
    norm.gamma = Param::from_tensor(leaf([576], 3));
    let x = leaf([2, 50, 576], 4);
    let fused = rms_norm(&norm, x.clone()).unwrap_or_else(|_| panic!("the fused path"));
    let composed = norm.forward(x.clone());
    assert!(worst(&vec_of(fused.clone().inner()), &vec_of(composed.clone().inner())) < 1e-6);
    let gf = probe(fused, 5).backward();
    let gc = probe(composed, 5).backward();
    let e = worst(&vec_of(x.grad(&gf).unwrap()), &vec_of(x.grad(&gc).unwrap()));
    assert!(e < 2e-5, "dx: max relative error {e}");
    let w = norm.gamma.val();
    let e = worst(&vec_of(w.grad(&gf).unwrap()), &vec_of(w.grad(&gc).unwrap()));
    assert!(e < 2e-5, "dgamma: max relative error {e}");
}

#[test]
fn cross_entropy_and_its_gradient_equal_log_softmax_and_gather() {
    let dev = Default::default();
    let (n, v) = (37, 1000);
    let z0 = leaf([n, v], 6);
    // One scaled copy per graph (a backward pass frees the nodes it visits).
    let z = || z0.clone().mul_scalar(3.0);
    let t: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % v as i64).collect();
    let targets = Tensor::<A, 1, Int>::from_data(TensorData::new(t.clone(), [n]), &dev);
    let fused = cross_entropy(z(), targets.clone()).unwrap_or_else(|_| panic!("the fused path"));
    let logp = burn::tensor::activation::log_softmax(z(), 1);
    let composed = logp.gather(1, targets.clone().reshape([n, 1])).mean().neg();
    let (a, b) = (vec_of(fused.clone().inner())[0], vec_of(composed.clone().inner())[0]);
    assert!((a - b).abs() < 1e-5 * b.abs(), "loss {a} vs {b}");
    // An upstream factor (the loss is one term of a weighted sum).
    let gf = fused.mul_scalar(2.5).backward();
    let gc = composed.mul_scalar(2.5).backward();
    let (df, dc) = (z0.grad(&gf).expect("fused: a gradient"), z0.grad(&gc).expect("composed: a gradient"));
    let e = worst(&vec_of(df), &vec_of(dc));
    assert!(e < 1e-6, "dlogits: max relative error {e}");
    // Without autodiff (perplexity), the same value.
    let zc = Tensor::<CpuBackend, 2>::from_data(TensorData::new(values(n * v, 6), [n, v]), &dev).mul_scalar(3.0);
    let tc = Tensor::<CpuBackend, 1, Int>::from_data(TensorData::new(t, [n]), &dev);
    let plain = cross_entropy(zc, tc).unwrap_or_else(|_| panic!("the CPU path"));
    assert!((vec_of(plain)[0] - b).abs() < 1e-5 * b.abs());
}

#[test]
fn attention_gradients_equal_burns_composition() {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    let dev = Default::default();
    let (b, h, kvh, s, hd) = (2, 6, 2, 150, 16); // three query blocks, the last partial
    let cfg = super::super::cpu_ops::tests::llama_config(h, kvh, hd);
    let tables = super::super::rope::Rope::new(&cfg).tables::<A>(0, s, &dev);
    let (q, k, v) = (leaf([b, s, h * hd], 7), leaf([b, s, kvh * hd], 8), leaf([b, s, kvh * hd], 10));
    let fused = attention_rows(q.clone(), k.clone(), v.clone(), &tables, h, kvh, None)
        .unwrap_or_else(|_| panic!("the fused path"));
    let heads = |x: Tensor<A, 3>, n: usize| x.reshape([b, s, n, hd]).swap_dims(1, 2);
    let rep = |x: Tensor<A, 4>| x.reshape([b, kvh, 1, s, hd]).repeat_dim(2, h / kvh).reshape([b, h, s, hd]);
    let qr = super::super::rope::Rope::apply(heads(q.clone(), h), &tables);
    let kr = rep(super::super::rope::Rope::apply(heads(k.clone(), kvh), &tables));
    let opts = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
    let composed =
        attention(qr, kr, rep(heads(v.clone(), kvh)), None, None, opts).swap_dims(1, 2).reshape([b, s, h * hd]);
    let e = worst(&vec_of(fused.clone().inner()), &vec_of(composed.clone().inner()));
    assert!(e < 1e-5, "forward: max relative error {e}");
    let gf = probe(fused, 11).backward();
    let gc = probe(composed, 11).backward();
    for (name, t) in [("q", &q), ("k", &k), ("v", &v)] {
        let e = worst(&vec_of(t.grad(&gf).unwrap()), &vec_of(t.grad(&gc).unwrap()));
        assert!(e < 5e-5, "d{name}: max relative error {e}");
    }
}

#[test]
fn frozen_inputs_get_no_gradient_and_other_backends_are_refused() {
    let (g, u) =
        (leaf([4, 8], 1), Tensor::<A, 2>::from_data(TensorData::new(values(32, 2), [4, 8]), &Default::default()));
    let y = gated_product(g.clone(), u.clone(), GateActivation::Silu).unwrap_or_else(|_| panic!("fused"));
    let grads = probe(y, 3).backward();
    assert!(g.grad(&grads).is_some());
    assert!(u.grad(&grads).is_none(), "an untracked input gets no gradient");
    let gc = Tensor::<CpuBackend, 2>::zeros([2, 2], &Default::default());
    assert!(gated_product(gc.clone(), gc, GateActivation::Silu).is_err(), "not autodiff: the caller's path");
}

#[test]
fn a_frozen_16_bit_product_has_the_gradient_of_its_f32_copy() {
    use super::super::weights::{weight_tensor, WeightsDtype};
    let dev = Default::default();
    for (dtype, transposed) in [(WeightsDtype::Bf16, false), (WeightsDtype::F16, false), (WeightsDtype::Bf16, true)] {
        let (rows, d_in, d_out) = (37, 96, 200);
        let dims = if transposed { [d_out, d_in] } else { [d_in, d_out] };
        let w16 = weight_tensor::<A, 2>(values(d_in * d_out, 12), dims, dtype, "t", "w", &dev).unwrap();
        // The f32 reference holds the same (rounded) values, untracked.
        let w32 = super::super::weights::weight_f32(w16.clone().inner());
        let w32 = Tensor::<A, 2>::from_inner(if transposed { w32.transpose() } else { w32 });
        let x = leaf([rows, d_in], 13);
        let fused = frozen_product(x.clone(), w16.clone(), transposed).unwrap_or_else(|_| panic!("the fused path"));
        let composed = x.clone().matmul(w32);
        let e = worst(&vec_of(fused.clone().inner()), &vec_of(composed.clone().inner()));
        assert!(e < 1e-6, "{dtype:?} transposed {transposed}: forward {e}");
        let gf = probe(fused, 14).backward();
        let gc = probe(composed, 14).backward();
        let e = worst(&vec_of(x.grad(&gf).unwrap()), &vec_of(x.grad(&gc).unwrap()));
        assert!(e < 1e-6, "{dtype:?} transposed {transposed}: dx {e}");
        assert!(w16.grad(&gf).is_none(), "the frozen weight gets no gradient");
    }
    // A weight that trains, an f32 weight, or another backend: the caller's path.
    let x = leaf([2, 4], 1);
    assert!(frozen_product(x.clone(), leaf([4, 3], 2), false).is_err(), "f32 weight");
    let w = weight_tensor::<A, 2>(values(12, 3), [4, 3], WeightsDtype::Bf16, "t", "w", &dev).unwrap();
    assert!(frozen_product(x, w.require_grad(), false).is_err(), "a weight that needs a gradient");
    let xc = Tensor::<CpuBackend, 2>::zeros([2, 4], &dev);
    let wc = weight_tensor::<CpuBackend, 2>(values(12, 3), [4, 3], WeightsDtype::Bf16, "t", "w", &dev).unwrap();
    assert!(frozen_product(xc, wc, false).is_err(), "not autodiff");
}
