// bfloat16 codec, two values per u32 (element 2k in the low half, as in
// little-endian memory). Decoding is a shift; encoding rounds to nearest,
// ties to even, NaN kept quiet - the `half` crate's `bf16::from_f32`.
// Prepended to the packed 16-bit kernels (`graft_packed16.wgsl`, ...).

fn f32_to_bf16(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (x >> 16u) | 0x0040u;
    }
    let round_bit = 0x8000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
        return ((x >> 16u) + 1u) & 0xffffu;
    }
    return x >> 16u;
}

fn unpack2(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

fn pack2(v: vec2<f32>) -> u32 {
    return f32_to_bf16(v.x) | (f32_to_bf16(v.y) << 16u);
}
