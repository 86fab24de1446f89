// Gram accumulation for the ridge router (DUME, methods.md §2):
//   C[m, ncols] += L^T R,  L = [n, m] row-major, R = [n, ncols] row-major
// so A += X^T X (L = R = X) and B += X^T Y (L = X, R = Y one-hot) are the
// same kernel. A workgroup of 8x8 invocations computes a 64x64 tile of C,
// each invocation an 8x8 block in registers (rows ty + 8a, columns
// tx + 8b, so that neighbouring invocations read neighbouring words). Rows
// of L and R are staged through workgroup memory 16 at a time. Sums are
// f32; each dispatch adds its chunk of rows into C.

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

@compute @workgroup_size(8, 8)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.x * TM;
    let col0 = wid.y * TM;
    let t = lid.y * 8u + lid.x;
    // Row ty + 8a of the block: columns tx + 8b in pa (b < 4) and qa (b >= 4).
    var p0 = vec4<f32>(0.0);
    var q0 = vec4<f32>(0.0);
    var p1 = vec4<f32>(0.0);
    var q1 = vec4<f32>(0.0);
    var p2 = vec4<f32>(0.0);
    var q2 = vec4<f32>(0.0);
    var p3 = vec4<f32>(0.0);
    var q3 = vec4<f32>(0.0);
    var p4 = vec4<f32>(0.0);
    var q4 = vec4<f32>(0.0);
    var p5 = vec4<f32>(0.0);
    var q5 = vec4<f32>(0.0);
    var p6 = vec4<f32>(0.0);
    var q6 = vec4<f32>(0.0);
    var p7 = vec4<f32>(0.0);
    var q7 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < params.n; k0 += TK) {
        // Stage rows k0..k0+16 of L (columns row0..row0+64) and of R
        // (columns col0..col0+64); zeros outside the matrices.
        for (var q = 0u; q < 16u; q++) {
            let idx = t + 64u * q;
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
            let x = lid.x;
            let r0 = vec4<f32>(rs[kk][x], rs[kk][x + 8u], rs[kk][x + 16u], rs[kk][x + 24u]);
            let r1 = vec4<f32>(rs[kk][x + 32u], rs[kk][x + 40u], rs[kk][x + 48u], rs[kk][x + 56u]);
            // Unrolled: lavapipe keeps named values in registers, while an
            // indexed private array becomes per-invocation memory.
            let l0 = ls[kk][lid.y + 0u];
            p0 += l0 * r0;
            q0 += l0 * r1;
            let l1 = ls[kk][lid.y + 8u];
            p1 += l1 * r0;
            q1 += l1 * r1;
            let l2 = ls[kk][lid.y + 16u];
            p2 += l2 * r0;
            q2 += l2 * r1;
            let l3 = ls[kk][lid.y + 24u];
            p3 += l3 * r0;
            q3 += l3 * r1;
            let l4 = ls[kk][lid.y + 32u];
            p4 += l4 * r0;
            q4 += l4 * r1;
            let l5 = ls[kk][lid.y + 40u];
            p5 += l5 * r0;
            q5 += l5 * r1;
            let l6 = ls[kk][lid.y + 48u];
            p6 += l6 * r0;
            q6 += l6 * r1;
            let l7 = ls[kk][lid.y + 56u];
            p7 += l7 * r0;
            q7 += l7 * r1;
        }
        workgroupBarrier();
    }
    let acc = array<vec4<f32>, 16>(p0, p1, p2, p3, p4, p5, p6, p7, q0, q1, q2, q3, q4, q5, q6, q7);
    for (var a = 0u; a < 8u; a++) {
        let i = row0 + lid.y + 8u * a;
        if (i >= params.m) {
            break;
        }
        for (var b = 0u; b < 8u; b++) {
            let j = col0 + lid.x + 8u * b;
            if (j < params.ncols) {
                c[i * params.ncols + j] += acc[a + 8u * (b / 4u)][b % 4u];
            }
        }
    }
}
