//! Helpers to build Burn `Linear` layers from Hugging Face weights.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor, TensorData};

use super::weights::{weight_f32, weight_tensor, WeightsDtype};
use crate::error::Result;

/// Builds a Burn [`Linear`] from a Hugging Face weight stored
/// `[out_features, in_features]` (row-major), transposing it to Burn's
/// `[in_features, out_features]`, and an optional bias `[out_features]`.
///
/// # Panics
/// If `weight.len() != out_features * in_features` or the bias length is not
/// `out_features` (callers validate shapes against the config first).
pub fn linear_from_hf<B: Backend>(
    weight: &[f32],
    out_features: usize,
    in_features: usize,
    bias: Option<Vec<f32>>,
    device: &B::Device,
) -> Linear<B> {
    linear_from_hf_as(weight, out_features, in_features, bias, WeightsDtype::F32, "", "", device)
        .expect("f32 weights convert without error")
}

/// [`linear_from_hf`] with the weight held in `dtype` (the bias stays f32;
/// [`super::weights`]). `source` and `name` name the tensor in errors.
///
/// # Errors
/// As [`weight_tensor`]: an f16 weight with a value past f16's range.
///
/// # Panics
/// As [`linear_from_hf`].
#[allow(clippy::too_many_arguments)]
pub fn linear_from_hf_as<B: Backend>(
    weight: &[f32],
    out_features: usize,
    in_features: usize,
    bias: Option<Vec<f32>>,
    dtype: WeightsDtype,
    source: &str,
    name: &str,
    device: &B::Device,
) -> Result<Linear<B>> {
    assert_eq!(weight.len(), out_features * in_features);
    let mut t = vec![0f32; weight.len()];
    for o in 0..out_features {
        let row = &weight[o * in_features..(o + 1) * in_features];
        for (i, v) in row.iter().enumerate() {
            t[i * out_features + o] = *v;
        }
    }
    let w = weight_tensor::<B, 2>(t, [in_features, out_features], dtype, source, name, device)?;
    let bias = bias.map(|b| {
        assert_eq!(b.len(), out_features);
        Param::from_tensor(Tensor::<B, 1>::from_data(TensorData::new(b, [out_features]), device))
    });
    Ok(Linear { weight: Param::from_tensor(w), bias })
}

/// Reads a Burn [`Linear`] back into Hugging Face layout
/// `[out_features, in_features]` (row-major) plus the optional bias.
pub fn linear_to_hf<B: Backend>(linear: &Linear<B>) -> (Vec<f32>, [usize; 2], Option<Vec<f32>>) {
    let w = linear.weight.val();
    let [in_features, out_features] = w.dims();
    let data: Vec<f32> = w.transpose().into_data().convert::<f32>().to_vec().expect("f32 data");
    let bias = linear.bias.as_ref().map(|b| b.val().into_data().convert::<f32>().to_vec().expect("f32 data"));
    (data, [out_features, in_features], bias)
}

/// `linear.forward(x)` for `x: [..., in]` run as one `[rows, in] x [in, out]`
/// matrix product (`rows` = the product of the leading dimensions), then
/// reshaped back to `[..., out]`.
///
/// Burn's `Linear` broadcasts its weight over the leading dimensions as a
/// batched product, whose backward forms one `[in, out]` weight gradient per
/// batch entry and then sums them; one 2-D product gives the same values
/// with a single gradient and one large, better-threaded gemm call.
///
/// A 16-bit weight ([`super::weights`]) is converted to f32 for the product
/// (the activations stay f32); a frozen one in training takes
/// [`super::cpu_grad::frozen_product`], which keeps it in 16 bits.
pub fn forward_rows<B: Backend, const D: usize>(linear: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    let w = linear.weight.val();
    if w.dtype() != x.dtype() {
        let mut dims = x.dims();
        let rows: usize = dims[..D - 1].iter().product();
        let mut y = product_16bit(x.reshape([rows, dims[D - 1]]), w);
        if let Some(b) = &linear.bias {
            y = y + b.val().unsqueeze_dim(0);
        }
        dims[D - 1] = y.dims()[1];
        return y.reshape(dims);
    }
    if D <= 2 {
        return linear.forward(x);
    }
    let mut dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    let y = linear.forward(x.reshape([rows, dims[D - 1]]));
    dims[D - 1] = y.dims()[1];
    y.reshape(dims)
}

/// `x · w` for `x: [rows, in]` (f32) and a 16-bit weight `w: [in, out]`:
/// a frozen weight in training takes [`super::cpu_grad::frozen_product`]
/// (the weight stays 16-bit in the graph); a decoding step on the CPU
/// reads the 16-bit weight directly ([`super::weights::small_rows_product`]);
/// anything else multiplies by `w` widened to f32.
fn product_16bit<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    #[cfg(not(target_arch = "wasm32"))]
    let (x, w) = match super::cpu_grad::frozen_product(x, w, false) {
        Ok(y) => return y,
        Err(xw) => xw,
    };
    #[cfg(not(target_arch = "wasm32"))]
    {
        let rows = x.dims()[0];
        if rows <= super::weights::SMALL_ROWS && super::cpu_ops::is_cpu::<B>() && x.dtype() == burn::tensor::DType::F32
        {
            let xf = super::cpu_ops::contiguous(super::cpu_ops::to_flex(x.clone()));
            let wf = super::cpu_ops::to_flex(w.clone());
            if let Some(v) =
                super::weights::small_rows_product(xf.as_slice::<f32>().expect("contiguous f32"), rows, &wf)
            {
                let out = wf.layout().shape()[1];
                return super::cpu_ops::from_flex(super::cpu_ops::flex_from_vec(v, &[rows, out]));
            }
        }
    }
    x.matmul(weight_f32(w))
}
