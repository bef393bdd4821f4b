// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Adam/AdamW as the phases of torch.optim's foreach and for-loop paths
// (_multi_tensor_adam, _single_tensor_adam), one parameter per dispatch
// (or a list of them, LIST below), into temporaries the caller allocated
// when PyTorch does:
//   0 wd       a = g + wd p                  grad.add(param, alpha=wd)  (Adam)
//   1 moments  [AdamW: p *= 1 - lr wd]; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²
//   2 denom    a = sqrt(v) / bc2_sqrt + eps   _foreach_sqrt, _foreach_div_, _foreach_add_ (in 7, 8)
//   3 apply    p -= (lr / bc1) m / a          addcdiv_(exp_avg, denom, -step_size)
//   4 sqrt     a = sqrt(v)                    exp_avg_sq.sqrt()
//   5 div      b = a / bc2_sqrt               ... / bias_correction2_sqrt
//   6 eps      a += eps                       .add_(eps)
//   7 moments, denom, apply (1, 2, 3) in one pass over a parameter: the
//     foreach path's three list ops, each element through the same stores
//     and loads (so the same bits), one dispatch instead of three
//   8 denom, apply (2, 3) in one pass (Adam's weight decay: the moments
//     read a gradient list freed before the denominators exist)
// Bindings a phase does not use are bound to any tensor of the same size.
// LIST: one of the foreach path's phases (0, 1, 7, 8) over COUNT (2..16)
// parameters in one dispatch, as PyTorch's one multi-tensor launch:
// parameter t's param, grad, m, v and a at bindings 5t..5t+4, its workgroups
// ending at ends[t]. Each parameter runs the function
// it runs alone (COUNT 1), so the same bits.
struct Params {
    n: u32, decoupled: u32, phase: u32, _p1: u32,
    lr: f32, beta1: f32, beta2: f32, eps: f32,
    weight_decay: f32, bc1: f32, bc2_sqrt: f32, _p2: f32,
#if LIST
    // Where each parameter's workgroups end (256 words each, the last
    // partly), and its element count.
    ends: array<vec4<u32>, 4>,
    counts: array<vec4<u32>, 4>,
#endif
}

#for t in 0..COUNT
@group(0) @binding({{5*t}}) var<storage, read_write> param{{t}}: array<{{T}}>;
@group(0) @binding({{5*t+1}}) var<storage, read_write> grad{{t}}: array<{{T}}>;
@group(0) @binding({{5*t+2}}) var<storage, read_write> m{{t}}: array<{{T}}>;
@group(0) @binding({{5*t+3}}) var<storage, read_write> v{{t}}: array<{{T}}>;
@group(0) @binding({{5*t+4}}) var<storage, read_write> a{{t}}: array<{{T}}>;
#accessors param{{t}} grad{{t}} m{{t}} v{{t}} a{{t}}
#endfor
#if LIST
@group(0) @binding({{5*COUNT}}) var<uniform> p: Params;
#else
@group(0) @binding(5) var<storage, read_write> b0: array<{{T}}>;
@group(0) @binding(6) var<uniform> p: Params;
#accessors b0
#endif
#include prelude
// Elements an invocation (list_main).
const PER: u32 = 2u;

// Elements i and j (= i + 1, or i at the end) of word w of parameter t (n
// elements): each invocation owns its pair, so it reads back what it
// stored (16-bit values rounded).
#for t in 0..COUNT
fn moments{{t}}(w: u32, i: u32, j: u32, n: u32) {
    let g = vec2<f32>(ld_grad{{t}}(i), ld_grad{{t}}(j));
    if (p.decoupled != 0u && p.weight_decay != 0.0) {
        st2_param{{t}}(w, vec2<f32>(ld_param{{t}}(i), ld_param{{t}}(j)) * (1.0 - p.lr * p.weight_decay), n);
    }
    st2_m{{t}}(w, p.beta1 * vec2<f32>(ld_m{{t}}(i), ld_m{{t}}(j)) + (1.0 - p.beta1) * g, n);
    st2_v{{t}}(w, p.beta2 * vec2<f32>(ld_v{{t}}(i), ld_v{{t}}(j)) + (1.0 - p.beta2) * g * g, n);
}

fn denom{{t}}(w: u32, i: u32, j: u32, n: u32) {
    st2_a{{t}}(w, sqrt(vec2<f32>(ld_v{{t}}(i), ld_v{{t}}(j))) / p.bc2_sqrt + p.eps, n);
}

fn apply{{t}}(w: u32, i: u32, j: u32, n: u32) {
    let d = vec2<f32>(ld_a{{t}}(i), ld_a{{t}}(j));
    let mi = vec2<f32>(ld_m{{t}}(i), ld_m{{t}}(j));
    st2_param{{t}}(w, vec2<f32>(ld_param{{t}}(i), ld_param{{t}}(j)) - (p.lr / p.bc1) * mi / d, n);
}

// Phases 0, 1, 3, 7 and 8 (those reading no b) on word w of parameter t:
// the foreach path lists 0, 1, 7 and 8 (7 and 8 are its list ops fused);
// the for-loop path runs 3 alone.
fn phase{{t}}(w: u32, n: u32) {
    let i = 2u * w;
    let j = min(i + 1u, n - 1u);
    switch p.phase {
        case 0u: {
            st2_a{{t}}(w, vec2<f32>(ld_grad{{t}}(i), ld_grad{{t}}(j)) + p.weight_decay * vec2<f32>(ld_param{{t}}(i), ld_param{{t}}(j)), n);
        }
        case 1u: {
            moments{{t}}(w, i, j, n);
        }
        case 3u: {
            apply{{t}}(w, i, j, n);
        }
        case 7u: {
            moments{{t}}(w, i, j, n);
            denom{{t}}(w, i, j, n);
            apply{{t}}(w, i, j, n);
        }
        default: {
            denom{{t}}(w, i, j, n);
            apply{{t}}(w, i, j, n);
        }
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
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    switch p.phase {
        case 4u: {
            st2_a0(w, sqrt(vec2<f32>(ld_v0(i), ld_v0(j))), p.n);
        }
        case 5u: {
            st2_b0(w, vec2<f32>(ld_a0(i), ld_a0(j)) / p.bc2_sqrt, p.n);
        }
        case 6u: {
            st2_a0(w, vec2<f32>(ld_a0(i), ld_a0(j)) + p.eps, p.n);
        }
        default: {
            phase0(w, p.n);
        }
    }
#endif
}
