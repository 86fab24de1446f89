//! GGML tensor types: the `ggml_type` id table, block layouts, and
//! dequantization of the float and block-quantized types to f32.
//!
//! Block layouts and dequantization follow ggml's `ggml-common.h` (the
//! `block_q*` structs) and the reference `dequantize_row_*` functions of
//! `ggml-quants.c`, bit for bit: every value is computed with the same f32
//! operations in the same order (`d * q`, `d * q + m`, `d1 * q - m1`,
//! `(d * sc) * q`), so results equal those of ggml and of the Python `gguf`
//! package (`gguf.quants.dequantize`) exactly. All multi-byte fields are
//! little-endian; `f16` fields are IEEE binary16.
//!
//! | type | elements / block | bytes / block | layout |
//! |------|-----------------:|--------------:|--------|
//! | F32  | 1   | 4   | `f32` |
//! | F16  | 1   | 2   | `f16` |
//! | BF16 | 1   | 2   | `bf16` |
//! | Q4_0 | 32  | 18  | `d: f16, qs: [u8; 16]` |
//! | Q4_1 | 32  | 20  | `d: f16, m: f16, qs: [u8; 16]` |
//! | Q5_0 | 32  | 22  | `d: f16, qh: [u8; 4], qs: [u8; 16]` |
//! | Q5_1 | 32  | 24  | `d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]` |
//! | Q8_0 | 32  | 34  | `d: f16, qs: [i8; 32]` |
//! | Q2_K | 256 | 84  | `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16` |
//! | Q3_K | 256 | 110 | `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16` |
//! | Q4_K | 256 | 144 | `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]` |
//! | Q5_K | 256 | 176 | `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]` |
//! | Q6_K | 256 | 210 | `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16` |
//! | Q8_K | 256 | 292 | `d: f32, qs: [i8; 256], bsums: [i16; 16]` |
//!
//! Other ggml types (the `IQ*` family, `TQ*`, `MXFP4`, integer types) are
//! known by name and layout, so a GGUF file holding them can be parsed, but
//! they cannot be dequantized.

use crate::tensor_io::dtype::DType;

/// Maps a `ggml_type` id (as stored in a GGUF tensor info) to a [`DType`].
///
/// Ids follow the `ggml_type` enum of ggml's `ggml.h`: 0 F32, 1 F16, 2 Q4_0,
/// 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K,
/// 14 Q6_K, 15 Q8_K, 30 BF16. Other known ids map to [`DType::Other`] with
/// ggml's name for the type (e.g. `"IQ2_XXS"`); removed or unknown ids map to
/// `DType::Other("unknown")` (and [`block_layout`] returns `None` for them).
pub fn ggml_dtype(type_id: u32) -> DType {
    match type_id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        9 => DType::Other("Q8_1"),
        10 => DType::Q2K,
        11 => DType::Q3K,
        12 => DType::Q4K,
        13 => DType::Q5K,
        14 => DType::Q6K,
        15 => DType::Q8K,
        16 => DType::Other("IQ2_XXS"),
        17 => DType::Other("IQ2_XS"),
        18 => DType::Other("IQ3_XXS"),
        19 => DType::Other("IQ1_S"),
        20 => DType::Other("IQ4_NL"),
        21 => DType::Other("IQ3_S"),
        22 => DType::Other("IQ2_S"),
        23 => DType::Other("IQ4_XS"),
        24 => DType::Other("I8"),
        25 => DType::Other("I16"),
        26 => DType::Other("I32"),
        27 => DType::Other("I64"),
        28 => DType::Other("F64"),
        29 => DType::Other("IQ1_M"),
        30 => DType::BF16,
        34 => DType::Other("TQ1_0"),
        35 => DType::Other("TQ2_0"),
        39 => DType::Other("MXFP4"),
        _ => DType::Other("unknown"),
    }
}

/// The block layout `(elements per block, bytes per block)` of a GGML type,
/// as in ggml's `type_traits` table (`blck_size`, `type_size`).
///
/// Float types are blocks of one element. Returns `None` for
/// `DType::Other("unknown")` and any name ggml does not define.
pub fn block_layout(dtype: DType) -> Option<(usize, usize)> {
    Some(match dtype {
        DType::F32 => (1, 4),
        DType::F16 | DType::BF16 => (1, 2),
        DType::Q4_0 => (32, 18),
        DType::Q4_1 => (32, 20),
        DType::Q5_0 => (32, 22),
        DType::Q5_1 => (32, 24),
        DType::Q8_0 => (32, 34),
        DType::Q2K => (256, 84),
        DType::Q3K => (256, 110),
        DType::Q4K => (256, 144),
        DType::Q5K => (256, 176),
        DType::Q6K => (256, 210),
        DType::Q8K => (256, 292),
        DType::Other(name) => match name {
            "Q8_1" => (32, 36),
            "IQ2_XXS" => (256, 66),
            "IQ2_XS" => (256, 74),
            "IQ3_XXS" => (256, 98),
            "IQ1_S" => (256, 50),
            "IQ4_NL" => (32, 18),
            "IQ3_S" => (256, 110),
            "IQ2_S" => (256, 82),
            "IQ4_XS" => (256, 136),
            "I8" => (1, 1),
            "I16" => (1, 2),
            "I32" => (1, 4),
            "I64" | "F64" => (1, 8),
            "IQ1_M" => (256, 56),
            "TQ1_0" => (256, 54),
            "TQ2_0" => (256, 66),
            "MXFP4" => (32, 17),
            _ => return None,
        },
    })
}

/// The types [`dequantize`] supports, for error messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K";

/// Whether [`dequantize`] can convert `dtype`.
pub fn is_supported(dtype: DType) -> bool {
    !matches!(dtype, DType::Other(_))
}

/// The number of bytes `n_elements` values of `dtype` occupy, or `None` when
/// the type's layout is unknown, `n_elements` is not a whole number of
/// blocks, or the size overflows.
pub fn byte_size(dtype: DType, n_elements: usize) -> Option<usize> {
    let (be, bb) = block_layout(dtype)?;
    if !n_elements.is_multiple_of(be) {
        return None;
    }
    (n_elements / be).checked_mul(bb)
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Dequantizes `n_elements` values of `dtype` stored in `bytes` (a whole
/// number of blocks, tightly packed, in storage order) to f32.
///
/// The output has `n_elements` values in the same (storage) order. For a
/// GGUF tensor with dims `ne = [ne0, ne1]` that is row-major `[ne1, ne0]`.
///
/// # Errors
/// A message when `dtype` is not supported (the message lists the supported
/// types), when `n_elements` is not a multiple of the block size, or when
/// `bytes.len()` is not exactly the size of `n_elements` values.
pub fn dequantize(dtype: DType, bytes: &[u8], n_elements: usize) -> std::result::Result<Vec<f32>, String> {
    if !is_supported(dtype) {
        return Err(format!("cannot dequantize GGML type {dtype} (supported: {SUPPORTED})"));
    }
    let (be, bb) = block_layout(dtype).expect("supported types have a layout");
    if !n_elements.is_multiple_of(be) {
        return Err(format!("{n_elements} elements is not a multiple of the {dtype} block size {be}"));
    }
    let expected = (n_elements / be).checked_mul(bb);
    if expected != Some(bytes.len()) {
        return Err(format!(
            "{dtype}: {n_elements} elements need {} bytes, found {}",
            expected.map_or_else(|| "more than usize::MAX".to_string(), |e| e.to_string()),
            bytes.len()
        ));
    }
    let mut out = vec![0f32; n_elements];
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be));
    match dtype {
        DType::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (b, y) in blocks {
                y[0] = f16_at(b, 0);
            }
        }
        DType::BF16 => {
            for (b, y) in blocks {
                y[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        DType::Q8_0 => blocks.for_each(|(b, y)| deq_q8_0(b, y)),
        DType::Q4_0 => blocks.for_each(|(b, y)| deq_q4_0(b, y)),
        DType::Q4_1 => blocks.for_each(|(b, y)| deq_q4_1(b, y)),
        DType::Q5_0 => blocks.for_each(|(b, y)| deq_q5_0(b, y)),
        DType::Q5_1 => blocks.for_each(|(b, y)| deq_q5_1(b, y)),
        DType::Q2K => blocks.for_each(|(b, y)| deq_q2_k(b, y)),
        DType::Q3K => blocks.for_each(|(b, y)| deq_q3_k(b, y)),
        DType::Q4K => blocks.for_each(|(b, y)| deq_q4_k(b, y)),
        DType::Q5K => blocks.for_each(|(b, y)| deq_q5_k(b, y)),
        DType::Q6K => blocks.for_each(|(b, y)| deq_q6_k(b, y)),
        DType::Q8K => blocks.for_each(|(b, y)| deq_q8_k(b, y)),
        DType::Other(_) => unreachable!("checked above"),
    }
    Ok(out)
}

/// `block_q8_0 { d: f16, qs: [i8; 32] }`: `y = qs * d`.
#[inline]
fn deq_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

/// `block_q4_0 { d: f16, qs: [u8; 16] }`: low nibbles are elements 0..16,
/// high nibbles 16..32; `y = (q - 8) * d`.
#[inline]
fn deq_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    let (lo, hi) = y.split_at_mut(16);
    for j in 0..16 {
        lo[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        hi[j] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// `block_q4_1 { d: f16, m: f16, qs: [u8; 16] }`: `y = q * d + m`.
#[inline]
fn deq_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    let (lo, hi) = y.split_at_mut(16);
    for j in 0..16 {
        lo[j] = (qs[j] & 0x0F) as f32 * d + m;
        hi[j] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// `block_q5_0 { d: f16, qh: u32, qs: [u8; 16] }`: bit `j` of `qh` is the
/// fifth bit of element `j`; `y = (q - 16) * d`.
#[inline]
fn deq_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    let (lo, hi) = y.split_at_mut(16);
    for j in 0..16 {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        lo[j] = (((qs[j] & 0x0F) | xh0) as i32 - 16) as f32 * d;
        hi[j] = (((qs[j] >> 4) | xh1) as i32 - 16) as f32 * d;
    }
}

/// `block_q5_1 { d: f16, m: f16, qh: u32, qs: [u8; 16] }`: `y = q * d + m`.
#[inline]
fn deq_q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    let (lo, hi) = y.split_at_mut(16);
    for j in 0..16 {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        lo[j] = ((qs[j] & 0x0F) | xh0) as f32 * d + m;
        hi[j] = ((qs[j] >> 4) | xh1) as f32 * d + m;
    }
}

/// `block_q2_K { scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }`:
/// 16 sub-blocks of 16; sub-block scale `d * (sc & 15)`, min
/// `dmin * (sc >> 4)`; 2-bit values.
#[inline]
fn deq_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let d = f16_at(b, 80);
    let min = f16_at(b, 82);
    let mut is = 0;
    let mut yi = 0;
    for n in 0..2 {
        let q = &b[16 + 32 * n..16 + 32 * n + 32];
        for shift in [0u32, 2, 4, 6] {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                for l in 0..16 {
                    y[yi] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                    yi += 1;
                }
            }
        }
    }
}

/// `block_q3_K { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }`:
/// 16 sub-blocks of 16 with 6-bit signed scales (offset 32); 2 low bits in
/// `qs`, the high bit in `hmask` (value 4 subtracted when the bit is clear).
#[inline]
fn deq_q3_k(b: &[u8], y: &mut [f32]) {
    let hm = &b[0..32];
    let qs = &b[32..96];
    let sraw = &b[96..108];
    let d_all = f16_at(b, 108);
    // Unpack the 12 scale bytes into 16 6-bit values exactly as ggml does
    // with kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f.
    let aux = |i: usize| u32::from_le_bytes([sraw[4 * i], sraw[4 * i + 1], sraw[4 * i + 2], sraw[4 * i + 3]]);
    let (a0, a1, tmp) = (aux(0), aux(1), aux(2));
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0f0f_0f0f;
    let words = [
        (a0 & K2) | ((tmp & K1) << 4),
        (a1 & K2) | (((tmp >> 2) & K1) << 4),
        ((a0 >> 4) & K2) | (((tmp >> 4) & K1) << 4),
        ((a1 >> 4) & K2) | (((tmp >> 6) & K1) << 4),
    ];
    let mut scales = [0i8; 16];
    for (i, w) in words.iter().enumerate() {
        for (k, byte) in w.to_le_bytes().iter().enumerate() {
            scales[4 * i + k] = *byte as i8;
        }
    }
    let mut is = 0;
    let mut yi = 0;
    let mut m: u8 = 1;
    for n in 0..2 {
        let q = &qs[32 * n..32 * n + 32];
        for shift in [0u32, 2, 4, 6] {
            for half in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 0..16 {
                    let k = l + 16 * half;
                    let v = ((q[k] >> shift) & 3) as i32 - if hm[k] & m != 0 { 0 } else { 4 };
                    y[yi] = dl * v as f32;
                    yi += 1;
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`
/// (0..8) packed in the 12 `scales` bytes of Q4_K / Q5_K.
#[inline(always)]
fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `block_q4_K { d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`:
/// 8 sub-blocks of 32, `y = (d * sc) * q - (dmin * m)`.
#[inline]
fn deq_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let (sc1, m1) = get_scale_min_k4(2 * j, scales);
        let (sc2, m2) = get_scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let q = &qs[32 * j..32 * j + 32];
        let (y1, y2) = y[64 * j..64 * j + 64].split_at_mut(32);
        for l in 0..32 {
            y1[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y2[l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `block_q5_K { d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32],
/// qs: [u8; 128] }`: like Q4_K with a fifth bit from `qh`.
#[inline]
fn deq_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    let mut u1: u8 = 1;
    let mut u2: u8 = 2;
    for j in 0..4 {
        let (sc1, m1) = get_scale_min_k4(2 * j, scales);
        let (sc2, m2) = get_scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let ql = &qs[32 * j..32 * j + 32];
        let (y1, y2) = y[64 * j..64 * j + 64].split_at_mut(32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y1[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
            y2[l] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
        u1 = u1.wrapping_shl(2);
        u2 = u2.wrapping_shl(2);
    }
}

/// `block_q6_K { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`:
/// 16 sub-blocks of 16, 6-bit values offset by 32, `y = (d * sc) * q`.
#[inline]
fn deq_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// `block_q8_K { d: f32, qs: [i8; 256], bsums: [i16; 16] }`: `y = d * q`.
#[inline]
fn deq_q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[4..260]) {
        *y = d * (q as i8) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_layouts() {
        assert_eq!(ggml_dtype(0), DType::F32);
        assert_eq!(ggml_dtype(30), DType::BF16);
        assert_eq!(ggml_dtype(14), DType::Q6K);
        assert_eq!(ggml_dtype(4), DType::Other("unknown"));
        assert_eq!(block_layout(ggml_dtype(3)), Some((32, 20)));
        assert_eq!(block_layout(ggml_dtype(16)), Some((256, 66)));
        assert_eq!(block_layout(DType::Other("unknown")), None);
        assert_eq!(byte_size(DType::Q4_1, 64), Some(40));
        assert_eq!(byte_size(DType::Q4_1, 33), None);
    }

    #[test]
    fn size_mismatch_and_unsupported_are_errors() {
        let e = dequantize(DType::Q8_0, &[0u8; 33], 32).unwrap_err();
        assert!(e.contains("34") && e.contains("33"), "{e}");
        let e = dequantize(DType::Q8_0, &[0u8; 34], 31).unwrap_err();
        assert!(e.contains("block size"), "{e}");
        let e = dequantize(DType::Other("IQ2_XXS"), &[0u8; 66], 256).unwrap_err();
        assert!(e.contains("IQ2_XXS") && e.contains("Q4_K"), "{e}");
    }

    #[test]
    fn q4_0_by_hand() {
        // d = 1.0 (f16 0x3C00); byte j = (j & 15) | ((15 - j) << 4)
        let mut b = vec![0x00, 0x3C];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize(DType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], j as f32 - 8.0);
            assert_eq!(y[j + 16], (15 - j) as f32 - 8.0);
        }
    }
}
