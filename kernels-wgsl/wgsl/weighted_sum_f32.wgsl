// One term of a weighted sum over f32 tensors: acc += x * weight.
// The runner dispatches this once per input tensor, in order, so that
//   out = ((0 + x_0 w_0) + x_1 w_1) + ...
// with every operation an f32 operation, as the CPU linear merge
// (shared/src/methods/merge.rs) computes it. Flags: bit 0 = first term (the
// accumulator starts at 0), bit 1 = last term (the sum goes to `out`).

struct Params {
    len: u32,
    flags: u32,
    weight: f32,
    _pad: u32,
};

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= params.len) {
        return;
    }
    var a = 0.0;
    if ((params.flags & 1u) == 0u) {
        a = acc[i];
    }
    a = a + x[i] * params.weight;
    if ((params.flags & 2u) != 0u) {
        out[i] = a;
    } else {
        acc[i] = a;
    }
}
