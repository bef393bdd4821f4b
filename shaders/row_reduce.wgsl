// One 256-wide workgroup per row (`#include row_reduce`): each invocation
// walks the row 256 apart, then the workgroup combines the 256 partials in
// a tree. A row is never one invocation's loop, which would leave a GPU
// idle and stop short on llvmpipe (it ends any invocation's loops after
// 65,535 iterations in all). Every invocation must call these (barriers).
var<workgroup> row_part: array<f32, 256>;

// The row this workgroup reduces, in a grid spread over three dimensions.
fn row_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y;
}

fn row_max(t: u32, v: f32) -> f32 {
    row_part[t] = v;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (t < k) { row_part[t] = max(row_part[t], row_part[t + k]); }
        workgroupBarrier();
    }
    let r = row_part[0];
    workgroupBarrier();
    return r;
}

fn row_sum(t: u32, v: f32) -> f32 {
    row_part[t] = v;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (t < k) { row_part[t] = row_part[t] + row_part[t + k]; }
        workgroupBarrier();
    }
    let r = row_part[0];
    workgroupBarrier();
    return r;
}
