// One term of a weighted sum over 16-bit tensors packed two per u32 (f16 or
// bf16: the codec_*.wgsl prepended to this file supplies `unpack2` /
// `pack2`): acc += x * weight in f32; the last term rounds once into `out`.
// Dispatched once per input, in order, like weighted_sum_f32.wgsl. One
// invocation per u32 word (two f32 accumulator slots); the half past the end
// of an odd-length tensor is written as 0.

struct Params {
    len: u32,
    flags: u32,
    weight: f32,
    _pad: u32,
};

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = gid.x + gid.y * nwg.x * 256u;
    if (2u * w >= params.len) {
        return;
    }
    var a = vec2<f32>(0.0);
    if ((params.flags & 1u) == 0u) {
        a = vec2<f32>(acc[2u * w], acc[2u * w + 1u]);
    }
    a = a + unpack2(x[w]) * params.weight;
    if ((params.flags & 2u) != 0u) {
        if (2u * w + 1u >= params.len) {
            a.y = 0.0;
        }
        out[w] = pack2(a);
    } else {
        acc[2u * w] = a.x;
        acc[2u * w + 1u] = a.y;
    }
}
