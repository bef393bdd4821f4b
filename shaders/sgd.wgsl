// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// One SGD step as torch.optim.SGD (single-tensor path) does it:
//   g += wd * p
//   momentum: buf = g on the first step, else buf = momentum*buf + (1-dampening)*g;
//             g = g + momentum*buf (nesterov) or g = buf
//   p -= lr * g
// Without momentum `buf` is bound to the gradient and never written.
struct Params {
    n: u32, has_momentum: u32, first: u32, nesterov: u32,
    lr: f32, momentum: f32, dampening: f32, weight_decay: f32,
}

// Parameters, gradients and the buffer share the element type (ELEM);
// arithmetic is f32. One invocation per pair of elements.
@group(0) @binding(0) var<storage, read_write> param: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> grad: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> buf: array<{{T}}>;
#if SKIP
// GradScaler's inf/NaN flag (PyTorch's _fused_sgd_ with found_inf): where
// it is set the step changes nothing, decided on the device.
@group(0) @binding(3) var<storage, read_write> found: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;
#else
@group(0) @binding(3) var<uniform> p: Params;
#endif
#accessors param grad buf
#include prelude

// The updated (param, buffer) of element i.
fn step(i: u32) -> vec2<f32> {
    let w = ld_param(i);
    var g = ld_grad(i);
    if (p.weight_decay != 0.0) { g = g + p.weight_decay * w; }
    var b = g;
    if (p.has_momentum != 0u) {
        if (p.first == 0u) { b = p.momentum * ld_buf(i) + (1.0 - p.dampening) * g; }
        if (p.nesterov != 0u) { g = g + p.momentum * b; } else { g = b; }
    }
    return vec2<f32>(w - p.lr * g, b);
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
    if (p.has_momentum != 0u) { st2_buf(w, vec2<f32>(a.y, b.y), p.n); }
}
