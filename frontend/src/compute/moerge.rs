//! MoErge in the browser: N dense models -> one MoE with N experts
//! (`plan_moerge` + `write_moerge` into memory, as `moe-studio moerge`), one
//! tensor at a time, yielding between tensors.
//!
//! With a WebGPU device, the averaged (shared, non-FFN) tensors that
//! `moe_shared::methods::weighted_means` marks as exact f32 weighted sums
//! run on the WGSL `weighted_sum` kernel; everything else (experts, routers,
//! and the means only the CLI's f64 accumulator gives exactly) runs the
//! shared CPU code. Both paths write the CLI's bytes.

use moe_kernels::{ElemDtype, Gpu};
use moe_shared::checkpoint::plan::MoeTensor;
use moe_shared::methods::average::WeightedMean;
use moe_shared::methods::{plan_moerge, weighted_means, write_moerge, MoergeInput, MoergeOptions, MoergePlan};
use moe_shared::tensor_io::sink::{write_values, MemorySink};

use super::artifact::{card_file, into_artifact, pretty, tokenizer_json, Output};
use super::msg;
use super::progress::Progress;
use crate::store::{Artifact, Picked};
use moe_shared::checkpoint::output::card_moe_details;
use moe_shared::tensor_io::card::{CardMethod, ModelCard};

/// Where a MoErge computed its averaged (shared, non-FFN) tensors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoergeSummary {
    /// Output tensors.
    pub tensors: usize,
    /// Averaged tensors computed on the WGSL kernel.
    pub averaged_gpu: usize,
    /// Averaged tensors computed by the shared CPU code: no WebGPU, or not
    /// the kernel's arithmetic (three or more models, shapes that differ,
    /// values outside [`WeightedMean::inputs_exact`], a result refused by
    /// [`WeightedMean::output_exact`]).
    pub averaged_cpu: usize,
}

/// The mean of `inputs` (one input tensor's f32 values each) on the WGSL
/// `weighted_sum` kernel with the weights of `mean`, or `None` when the
/// values or the device's result are outside what equals the CPU mean bit
/// for bit (the caller then runs the shared CPU code).
///
/// # Errors
/// The kernel's error (device lost, out of memory), as text.
pub async fn gpu_mean(gpu: &Gpu, mean: &WeightedMean, inputs: &[Vec<f32>]) -> Result<Option<Vec<f32>>, String> {
    if inputs.len() != mean.weights.len() || !inputs.iter().all(|x| mean.inputs_exact(x)) {
        return Ok(None);
    }
    let bytes: Vec<&[u8]> = inputs.iter().map(|x| bytemuck::cast_slice::<f32, u8>(x)).collect();
    let out = gpu.weighted_sum(&bytes, &mean.weights, ElemDtype::F32).await.map_err(|e| e.to_string())?;
    let out: Vec<f32> = bytemuck::pod_collect_to_vec(&out);
    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    Ok(mean.output_exact(&refs, &out).then_some(out))
}

/// Computes tensor `t` on the kernel and writes it in `dtype`; `false` when
/// it must go to the CPU instead (nothing written).
async fn gpu_tensor(
    gpu: &Gpu,
    inputs: &[MoergeInput<'_>],
    t: &MoeTensor,
    dtype: moe_shared::tensor_io::DType,
    mean: &WeightedMean,
    sink: &mut MemorySink,
) -> Result<bool, String> {
    let values: Vec<Vec<f32>> =
        inputs.iter().map(|m| m.source.read_f32(&t.name)).collect::<Result<_, _>>().map_err(msg)?;
    let n: usize = t.shape.iter().product();
    if values.iter().any(|v| v.len() != n) {
        return Ok(false);
    }
    match gpu_mean(gpu, mean, &values).await.map_err(|e| format!("WebGPU mean of `{}`: {e}", t.name))? {
        Some(v) => {
            write_values(sink, &t.name, dtype, &v).map_err(msg)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// MoErges `models` (expert `i` = model `i`); the averaged tensors on the
/// WGSL kernel when `use_gpu` and a WebGPU device is open; progress in
/// output tensors.
///
/// # Errors
/// Fewer than two models, MoE inputs, mismatched architectures or
/// tokenizers (named by the plan), kernel errors.
pub async fn run(
    progress: &Progress,
    models: &[Picked],
    opts: &MoergeOptions,
    use_gpu: bool,
) -> Result<(Artifact, MoergeSummary), String> {
    let t0 = crate::web::now_ms();
    if let Some(p) = models.iter().find(|p| p.model().moe.is_some()) {
        return Err(format!("{} is already an MoE; MoErge takes dense models", p.name()));
    }
    let inputs: Vec<MoergeInput<'_>> = models
        .iter()
        .map(|p| {
            let m = p.model();
            MoergeInput {
                name: p.name(),
                source: m.source.as_ref(),
                config: &m.config,
                tokenizer: m.tokenizer.as_ref(),
            }
        })
        .collect();
    let plan = plan_moerge(&inputs, opts).map_err(msg)?;
    crate::load::check_fits("the MoErged model", &models[0].model().config, Some(&plan.moe))?;
    // The output (sink + serialised copy) and, per tensor, the f32 reads of
    // every model plus the mean (f64 on the CPU, the kernel's bytes + f32).
    let largest = plan.tensors.iter().map(|t| t.shape.iter().product::<usize>() as u64 * 4).max().unwrap_or(0);
    crate::memory::ensure(
        "MoErge",
        crate::memory::output_need(plan.planned.iter().map(|p| p.byte_len() as u64))
            + (inputs.len() as u64 + 3) * largest,
    )?;
    let gpu = if use_gpu { super::gpu::gpu() } else { None };
    let means = weighted_means(&inputs, &plan);
    let mut sink = MemorySink::new(plan.planned.clone());
    let mut part = MoergePlan { tensors: Vec::new(), planned: Vec::new(), ..plan.clone() };
    let n = plan.tensors.len();
    let mut summary = MoergeSummary { tensors: n, ..Default::default() };
    let what = if gpu.is_some() { "merging tensors (averages on WebGPU)" } else { "merging tensors" };
    for (i, (t, p)) in plan.tensors.iter().zip(&plan.planned).enumerate() {
        let averaged = matches!(t.origin, moe_shared::checkpoint::plan::Origin::Dense { .. });
        let on_gpu = match (&gpu, &means[i]) {
            (Some(g), Some(mean)) => gpu_tensor(g, &inputs, t, p.dtype, mean, &mut sink).await?,
            _ => false,
        };
        if !on_gpu {
            part.tensors = vec![t.clone()];
            part.planned = vec![p.clone()];
            write_moerge(&inputs, &part, opts, &mut sink).map_err(msg)?;
        }
        if averaged {
            if on_gpu {
                summary.averaged_gpu += 1;
            } else {
                summary.averaged_cpu += 1;
            }
        }
        progress.step(what, (i + 1) as u64, n as u64, "tensors");
    }
    // The layout's zero tensors (a Qwen2-MoE zero shared expert) end the plan.
    moe_shared::checkpoint::output::layout_sink(&mut sink, &plan.choice, &plan.planned, plan.tensors.len())
        .finish()
        .map_err(msg)?;
    progress.step("serialising safetensors", 0, 1, "files");
    let first = models[0].model();
    let name = format!("moerge-{}", models.iter().map(|p| p.name().to_string()).collect::<Vec<_>>().join("+"));
    let mut card = ModelCard::new(CardMethod::Dume);
    for (i, p) in models.iter().enumerate() {
        card = card.input(format!("expert {i}"), p.name(), None);
    }
    card_moe_details(&mut card, &first.config, &plan.choice, &plan.planned);
    card.detail("non-expert tensors", "averaged over the experts");
    let readme = card_file(card, &name, &plan.config_json);
    let out = Output {
        name,
        method: "moerge",
        safetensors: sink.into_safetensors().map_err(msg)?,
        config_json: pretty(&plan.config_json),
        tokenizer: first.tokenizer.clone(),
        tokenizer_json: tokenizer_json(first.tokenizer.as_ref()),
        extra: vec![readme],
        millis: crate::web::now_ms() - t0,
    };
    Ok((into_artifact(out)?, summary))
}

#[cfg(test)]
mod tests {
    use moe_shared::methods::average::{weighted_mean, MeanAccumulator};

    use super::*;

    /// Pairs over the f32 range: random bits, one exponent (ties), near
    /// cancellation, zeros of both signs.
    fn pairs(n: usize) -> (Vec<f32>, Vec<f32>) {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let (mut a, mut b) = (vec![0.0, -0.0, -0.0, 1.0], vec![-0.0, -0.0, 0.0, -1.0]);
        for i in 0..n {
            let (x, y) = (next() as u32, next() as u32);
            a.push(f32::from_bits(x));
            b.push(match i % 3 {
                0 => f32::from_bits(y),
                1 => f32::from_bits((x & 0xff80_0000) | (y & 0x007f_ffff)),
                _ => -f32::from_bits(x.wrapping_add(y % 5)),
            });
        }
        (a, b)
    }

    /// What the CLI writes: shared's f64 mean.
    fn cli_mean(a: &[f32], b: &[f32]) -> Vec<u32> {
        let mut m = MeanAccumulator::new(&[a.len()]);
        m.add(a, &[a.len()]);
        m.add(b, &[b.len()]);
        m.mean().iter().map(|v| v.to_bits()).collect()
    }

    /// Keeps the pairs whose values pass `inputs_exact` elementwise.
    fn exact_pairs(mean: &WeightedMean, n: usize) -> (Vec<f32>, Vec<f32>) {
        let (a, b) = pairs(n);
        a.into_iter().zip(b).filter(|(x, y)| mean.inputs_exact(&[*x, *y])).unzip()
    }

    #[test]
    fn the_kernel_reference_equals_the_cli_mean_on_exact_inputs() {
        let mean = weighted_mean(&[&[1], &[1]]).unwrap();
        let (a, b) = exact_pairs(&mean, 300_000);
        assert!(a.len() > 200_000);
        let out = moe_kernels::reference::weighted_sum(
            &[bytemuck::cast_slice(&a), bytemuck::cast_slice(&b)],
            &mean.weights,
            ElemDtype::F32,
        );
        let out: Vec<f32> = bytemuck::pod_collect_to_vec(&out);
        assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), cli_mean(&a, &b));
    }

    #[test]
    fn the_kernel_on_a_vulkan_device_equals_the_cli_mean_or_hands_back_to_the_cpu() {
        // lavapipe (mesa-vulkan-drivers) on CPU-only machines; skipped
        // without an adapter unless CI=true.
        let gpu = match Gpu::new_blocking() {
            Ok(g) => g,
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{e}"),
            Err(e) => return eprintln!("NOTICE: skipping the WebGPU MoErge mean test: {e}"),
        };
        eprintln!("GPU: {}", gpu.describe());
        let mean = weighted_mean(&[&[1], &[1]]).unwrap();
        let (a, b) = exact_pairs(&mean, 200_000);
        // Drop the pairs whose mean is subnormal: those are refused (a device
        // may flush them) and tested below.
        let (a, b): (Vec<f32>, Vec<f32>) =
            a.into_iter().zip(b).filter(|(x, y)| !(((*x as f64 + *y as f64) / 2.0) as f32).is_subnormal()).unzip();
        let got = moe_kernels::block_on(gpu_mean(&gpu, &mean, &[a.clone(), b.clone()])).unwrap();
        let got = got.expect("every input exact and every mean normal or zero");
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), cli_mean(&a, &b));
        // Inputs the kernel cannot halve exactly, and a subnormal mean.
        let tiny = [f32::MIN_POSITIVE, 1.0];
        assert_eq!(moe_kernels::block_on(gpu_mean(&gpu, &mean, &[tiny.to_vec(), vec![1.0, 1.0]])).unwrap(), None);
        let m = f32::MIN_POSITIVE * 2.0;
        let sub = moe_kernels::block_on(gpu_mean(&gpu, &mean, &[vec![1.5 * m], vec![-m]])).unwrap();
        assert_eq!(sub, None);
        // Three inputs: not a weighted mean of these weights.
        assert_eq!(moe_kernels::block_on(gpu_mean(&gpu, &mean, &[a.clone(), b.clone(), a])).unwrap(), None);
    }
}
