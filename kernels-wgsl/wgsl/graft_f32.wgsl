// Delta graft over f32 tensors: out[i] = target[i] + scale * (instruct[i] - base[i]).
// DeltaMoE phase 2 (methods.md §1): the alignment delta `instruct - base` added
// to a shared tensor or to every expert of a layer. One invocation per element;
// `params.offset` lets the runner split tensors larger than one binding.

struct Params {
    len: u32,
    offset: u32,
    scale: f32,
    _pad: u32,
};

@group(0) @binding(0) var<storage, read> target_in: array<f32>;
@group(0) @binding(1) var<storage, read> instruct: array<f32>;
@group(0) @binding(2) var<storage, read> base: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // 2-D dispatch so that more than 65535 workgroups fit.
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= params.len) {
        return;
    }
    out[i] = target_in[i] + params.scale * (instruct[i] - base[i]);
}
