// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// One Adam/AdamW step, fused, in PyTorch's formulation (torch.optim.Adam,
// single-tensor path):
//   g += wd * p (Adam) | p *= 1 - lr * wd (AdamW)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
struct Params {
    n: u32, decoupled: u32, _p0: u32, _p1: u32,
    lr: f32, beta1: f32, beta2: f32, eps: f32,
    weight_decay: f32, bc1: f32, bc2_sqrt: f32, _p2: f32,
}

// Parameters, gradients and both moments share the element type (ELEM: f32
// for mixed precision's master weights, f16/bf16 after model.half());
// arithmetic is f32. One invocation per pair of elements.
@group(0) @binding(0) var<storage, read_write> param: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> grad: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> m: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> v: array<{{T}}>;
#if SKIP
// GradScaler's inf/NaN flag (PyTorch's _fused_adam_ with found_inf): where
// it is set the step changes nothing, decided on the device.
@group(0) @binding(4) var<storage, read_write> found: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;
#else
@group(0) @binding(4) var<uniform> p: Params;
#endif
#accessors param grad m v
#include prelude

// The updated (param, m, v) of element i.
fn step(i: u32) -> vec3<f32> {
    var g = ld_grad(i);
    var w = ld_param(i);
    if (p.weight_decay != 0.0) {
        if (p.decoupled != 0u) { w = w * (1.0 - p.lr * p.weight_decay); }
        else { g = g + p.weight_decay * w; }
    }
    let mi = p.beta1 * ld_m(i) + (1.0 - p.beta1) * g;
    let vi = p.beta2 * ld_v(i) + (1.0 - p.beta2) * g * g;
    let denom = sqrt(vi) / p.bc2_sqrt + p.eps;
    return vec3<f32>(w - (p.lr / p.bc1) * mi / denom, mi, vi);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
#if SKIP
    if (found[0] != 0u) { return; }
#endif
    let a = step(i);
    let b = step(min(i + 1u, p.n - 1u));
    st2_param(w, vec2<f32>(a.x, b.x), p.n);
    st2_m(w, vec2<f32>(a.y, b.y), p.n);
    st2_v(w, vec2<f32>(a.z, b.z), p.n);
}
