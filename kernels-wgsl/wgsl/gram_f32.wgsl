// Gram accumulation for the ridge router (DUME, methods.md §2):
//   C[m, ncols] += L^T R,  L = [n, m] row-major, R = [n, ncols] row-major
// so A += X^T X (L = R = X) and B += X^T Y (L = X, R = Y one-hot) are the
// same kernel. A workgroup computes a 64x64 tile of C; each of its 16x16
// invocations a 4x4 block in registers. Rows of L and R are staged through
// workgroup memory 16 at a time. Sums are f32; each dispatch adds its chunk
// of rows into C.

const TK: u32 = 16u;
const TM: u32 = 64u;

struct Params {
    n: u32,
    m: u32,
    ncols: u32,
    _pad: u32,
};

@group(0) @binding(0) var<storage, read> l: array<f32>;
@group(0) @binding(1) var<storage, read> r: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

var<workgroup> ls: array<array<f32, 64>, 16>;
var<workgroup> rs: array<array<f32, 64>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.x * TM;
    let col0 = wid.y * TM;
    let t = lid.y * 16u + lid.x;
    var acc: array<vec4<f32>, 4>;
    for (var a = 0u; a < 4u; a++) {
        acc[a] = vec4<f32>(0.0);
    }
    for (var k0 = 0u; k0 < params.n; k0 += TK) {
        // Stage rows k0..k0+16 of L (columns row0..row0+64) and of R
        // (columns col0..col0+64); zeros outside the matrices.
        for (var q = 0u; q < 4u; q++) {
            let idx = t + 256u * q;
            let k = idx / TM;
            let ii = idx % TM;
            var lv = 0.0;
            var rv = 0.0;
            if (k0 + k < params.n) {
                if (row0 + ii < params.m) {
                    lv = l[(k0 + k) * params.m + row0 + ii];
                }
                if (col0 + ii < params.ncols) {
                    rv = r[(k0 + k) * params.ncols + col0 + ii];
                }
            }
            ls[k][ii] = lv;
            rs[k][ii] = rv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let lr = vec4<f32>(ls[kk][lid.y * 4u], ls[kk][lid.y * 4u + 1u], ls[kk][lid.y * 4u + 2u], ls[kk][lid.y * 4u + 3u]);
            let rr = vec4<f32>(rs[kk][lid.x * 4u], rs[kk][lid.x * 4u + 1u], rs[kk][lid.x * 4u + 2u], rs[kk][lid.x * 4u + 3u]);
            acc[0] += lr.x * rr;
            acc[1] += lr.y * rr;
            acc[2] += lr.z * rr;
            acc[3] += lr.w * rr;
        }
        workgroupBarrier();
    }
    for (var a = 0u; a < 4u; a++) {
        let i = row0 + lid.y * 4u + a;
        if (i >= params.m) {
            break;
        }
        for (var b = 0u; b < 4u; b++) {
            let j = col0 + lid.x * 4u + b;
            if (j < params.ncols) {
                c[i * params.ncols + j] += acc[a][b];
            }
        }
    }
}
