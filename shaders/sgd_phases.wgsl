// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// SGD as the phases of torch.optim's foreach and for-loop paths
// (_multi_tensor_sgd, _single_tensor_sgd), one parameter per dispatch, into
// temporaries the caller allocated when PyTorch does:
//   0 wd        a = g + wd p               grad.add(param, alpha=wd)
//   1 clone     buf = g                    grad.detach().clone() (first step)
//   2 momentum  buf = momentum buf + (1 - dampening) g
//   3 nesterov  g += momentum buf          _foreach_add_(device_grads, bufs)
//   4 nesterov  a = g + momentum buf       grad.add(buf, alpha=momentum)
//   5 apply     p -= lr g                  param.add_(grad, alpha=-lr)
// `g` is the grad binding: the gradient, or the temporary that replaced it.
struct Params {
    n: u32, phase: u32, _p0: u32, _p1: u32,
    lr: f32, momentum: f32, dampening: f32, weight_decay: f32,
}

@group(0) @binding(0) var<storage, read_write> param: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> grad: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> buf: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(4) var<uniform> p: Params;
#accessors param grad buf a
#include prelude

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    let g = vec2<f32>(ld_grad(i), ld_grad(j));
    switch p.phase {
        case 0u: { st2_a(w, g + p.weight_decay * vec2<f32>(ld_param(i), ld_param(j)), p.n); }
        case 1u: { st2_buf(w, g, p.n); }
        case 2u: { st2_buf(w, p.momentum * vec2<f32>(ld_buf(i), ld_buf(j)) + (1.0 - p.dampening) * g, p.n); }
        case 3u: { st2_grad(w, g + p.momentum * vec2<f32>(ld_buf(i), ld_buf(j)), p.n); }
        case 4u: { st2_a(w, g + p.momentum * vec2<f32>(ld_buf(i), ld_buf(j)), p.n); }
        default: { st2_param(w, vec2<f32>(ld_param(i), ld_param(j)) - p.lr * g, p.n); }
    }
}
