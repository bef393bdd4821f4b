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

@group(0) @binding(0) var<storage, read_write> param: array<f32>;
@group(0) @binding(1) var<storage, read_write> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> buf: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    let w = param[i];
    var g = grad[i];
    if (p.weight_decay != 0.0) { g = g + p.weight_decay * w; }
    if (p.has_momentum != 0u) {
        var b = g;
        if (p.first == 0u) { b = p.momentum * buf[i] + (1.0 - p.dampening) * g; }
        buf[i] = b;
        if (p.nesterov != 0u) { g = g + p.momentum * b; } else { g = b; }
    }
    param[i] = w - p.lr * g;
}
