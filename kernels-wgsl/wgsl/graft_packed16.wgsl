// Delta graft over 16-bit tensors packed two per u32 (f16 or bf16: the
// codec_*.wgsl prepended to this file supplies `unpack2` / `pack2`):
//   sd = scale * (instruct - base);  out = round(sd == 0 ? target : target + sd)
// computed in f32 from the exact upcast and rounded once, as the CPU graft
// (shared/src/methods/delta.rs; methods.md §1 phase 2). One invocation per
// u32 word; the half past the end of an odd-length tensor is written as 0.

struct Params {
    len: u32,
    _pad0: u32,
    scale: f32,
    _pad1: u32,
};

@group(0) @binding(0) var<storage, read> target_in: array<u32>;
@group(0) @binding(1) var<storage, read> instruct: array<u32>;
@group(0) @binding(2) var<storage, read> base: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = gid.x + gid.y * nwg.x * 256u;
    if (2u * w >= params.len) {
        return;
    }
    let t = unpack2(target_in[w]);
    let sd = params.scale * (unpack2(instruct[w]) - unpack2(base[w]));
    var r = select(t + sd, t, sd == vec2<f32>(0.0));
    if (2u * w + 1u >= params.len) {
        r.y = 0.0;
    }
    out[w] = pack2(r);
}
