// IEEE binary16 codec, two values per u32 (element 2k in the low half, as in
// little-endian memory). Pure bit operations, so no `shader-f16` feature is
// needed and results match the `half` crate exactly: decoding is exact
// (subnormals included) and encoding rounds to nearest, ties to even, with
// overflow to infinity and NaN kept quiet - `half`'s `f16::from_f32`.
// Prepended to the packed 16-bit kernels (`graft_packed16.wgsl`, ...).

fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = h & 0x7c00u;
    let man = h & 0x03ffu;
    if (e == 0x7c00u) {
        if (man == 0u) {
            return bitcast<f32>(sign | 0x7f800000u);
        }
        return bitcast<f32>(sign | 0x7fc00000u | (man << 13u));
    }
    if (e == 0u) {
        if (man == 0u) {
            return bitcast<f32>(sign);
        }
        // Subnormal: normalise (leading zeros of the 16-bit word minus 6).
        let z = 9u - firstLeadingBit(man);
        return bitcast<f32>(sign | ((112u - z) << 23u) | ((man << (14u + z)) & 0x7fffffu));
    }
    return bitcast<f32>(sign | (((e >> 10u) + 112u) << 23u) | (man << 13u));
}

fn f32_to_f16(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = x & 0x80000000u;
    let e = x & 0x7f800000u;
    let man = x & 0x007fffffu;
    let hs = sign >> 16u;
    if (e == 0x7f800000u) {
        var nan_bit = 0u;
        if (man != 0u) {
            nan_bit = 0x0200u;
        }
        return hs | 0x7c00u | nan_bit | (man >> 13u);
    }
    let half_exp = i32(e >> 23u) - 112;
    if (half_exp >= 31) {
        return hs | 0x7c00u;
    }
    if (half_exp <= 0) {
        if (half_exp < -10) {
            return hs;
        }
        let m = man | 0x00800000u;
        let sh = u32(14 - half_exp);
        var hm = m >> sh;
        let round_bit = 1u << (sh - 1u);
        if ((m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u) {
            hm = hm + 1u;
        }
        return hs | hm;
    }
    let h = hs | (u32(half_exp) << 10u) | (man >> 13u);
    let round_bit = 0x1000u;
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) {
        return h + 1u;
    }
    return h;
}

fn unpack2(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(w & 0xffffu), f16_to_f32(w >> 16u));
}

fn pack2(v: vec2<f32>) -> u32 {
    return f32_to_f16(v.x) | (f32_to_f16(v.y) << 16u);
}
