// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// SGD as the phases of torch.optim's foreach and for-loop paths
// (_multi_tensor_sgd, _single_tensor_sgd), one parameter per dispatch (or
// a list of them, LIST below), into temporaries the caller allocated when
// PyTorch does:
//   0 wd        a = g + wd p               grad.add(param, alpha=wd)
//   1 clone     buf = g                    grad.detach().clone() (first step)
//   2 momentum  buf = momentum buf + (1 - dampening) g
//   3 nesterov  g += momentum buf          _foreach_add_(device_grads, bufs)
//   4 nesterov  a = g + momentum buf       grad.add(buf, alpha=momentum)
//   5 apply     p -= lr g                  param.add_(grad, alpha=-lr)
// `g` is the grad binding: the gradient, or the temporary that replaced it.
// LIST: one phase over COUNT (2..16) parameters in one dispatch, as
// PyTorch's one multi-tensor launch: parameter t's param, grad, buf and a
// at bindings 4t..4t+3, its workgroups ending at ends[t].
// Each parameter runs the function it runs alone (COUNT 1), so the same
// bits.
struct Params {
    n: u32, phase: u32, _p0: u32, _p1: u32,
    lr: f32, momentum: f32, dampening: f32, weight_decay: f32,
#if LIST
    // Where each parameter's workgroups end (256 words each, the last
    // partly), and its element count.
    ends: array<vec4<u32>, 4>,
    counts: array<vec4<u32>, 4>,
#endif
}

#for t in 0..COUNT
@group(0) @binding({{4*t}}) var<storage, read_write> param{{t}}: array<{{T}}>;
@group(0) @binding({{4*t+1}}) var<storage, read_write> grad{{t}}: array<{{T}}>;
@group(0) @binding({{4*t+2}}) var<storage, read_write> buf{{t}}: array<{{T}}>;
@group(0) @binding({{4*t+3}}) var<storage, read_write> a{{t}}: array<{{T}}>;
#accessors param{{t}} grad{{t}} buf{{t}} a{{t}}
#endfor
@group(0) @binding({{4*COUNT}}) var<uniform> p: Params;
#include prelude
// Elements an invocation (list_main).
const PER: u32 = 2u;

// Word w of parameter t (n elements): elements i and j (= i + 1, or i at
// the end), each invocation owning its pair.
#for t in 0..COUNT
fn phase{{t}}(w: u32, n: u32) {
    let i = 2u * w;
    let j = min(i + 1u, n - 1u);
    let g = vec2<f32>(ld_grad{{t}}(i), ld_grad{{t}}(j));
    switch p.phase {
        case 0u: { st2_a{{t}}(w, g + p.weight_decay * vec2<f32>(ld_param{{t}}(i), ld_param{{t}}(j)), n); }
        case 1u: { st2_buf{{t}}(w, g, n); }
        case 2u: { st2_buf{{t}}(w, p.momentum * vec2<f32>(ld_buf{{t}}(i), ld_buf{{t}}(j)) + (1.0 - p.dampening) * g, n); }
        case 3u: { st2_grad{{t}}(w, g + p.momentum * vec2<f32>(ld_buf{{t}}(i), ld_buf{{t}}(j)), n); }
        case 4u: { st2_a{{t}}(w, g + p.momentum * vec2<f32>(ld_buf{{t}}(i), ld_buf{{t}}(j)), n); }
        default: { st2_param{{t}}(w, vec2<f32>(ld_param{{t}}(i), ld_param{{t}}(j)) - p.lr * g, n); }
    }
}
#endfor

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
#if LIST
#include list_main
#else
    if (2u * w >= p.n) { return; }
    phase0(w, p.n);
#endif
}
