// Delta graft over f32 tensors:
//   sd = scale * (instruct[i] - base[i]);  out[i] = sd == 0 ? target[i] : target[i] + sd
// DeltaMoE phase 2 (methods.md §1): the alignment delta `instruct - base`
// added to a shared tensor or to every expert of a layer. The same f32
// operations in the same order as the CPU graft (shared/src/methods/delta.rs
// `scaled_delta` + `add_scaled_delta`), so a zero delta keeps the target bit
// for bit (-0.0 included). One invocation per element; the runner splits
// tensors larger than one binding into chunks.

struct Params {
    len: u32,
    _pad0: u32,
    scale: f32,
    _pad1: u32,
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
    let t = target_in[i];
    let sd = params.scale * (instruct[i] - base[i]);
    out[i] = select(t + sd, t, sd == 0.0);
}
