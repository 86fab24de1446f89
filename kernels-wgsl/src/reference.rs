//! CPU references of the WGSL kernels (the ground truth their GPU tests
//! compare against).

/// `out[i] = target[i] + scale * (instruct[i] - base[i])`.
///
/// # Panics
/// If the slices differ in length.
pub fn graft_f32(target: &[f32], instruct: &[f32], base: &[f32], scale: f32) -> Vec<f32> {
    assert!(target.len() == instruct.len() && instruct.len() == base.len(), "graft: length mismatch");
    target.iter().zip(instruct).zip(base).map(|((t, i), b)| t + scale * (i - b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graft_is_the_per_element_arithmetic() {
        let out = graft_f32(&[1.0, 2.0, -3.0], &[0.5, 0.5, 1.0], &[0.25, 1.0, 1.0], 2.0);
        assert_eq!(out, vec![1.5, 1.0, -3.0]);
        // A zero delta leaves the target bit-identical.
        let t = [0.1f32, -7.25, 3.0e-8];
        assert_eq!(
            graft_f32(&t, &t, &t, 1.0).iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            t.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
