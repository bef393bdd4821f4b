// Inputs are bound read_write too: tensors share segment buffers, and wgpu
// rejects a read-only and a read-write binding of one buffer in one dispatch.
// Adam/AdamW as the phases of torch.optim's foreach and for-loop paths
// (_multi_tensor_adam, _single_tensor_adam), one parameter per dispatch,
// into temporaries the caller allocated when PyTorch does:
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
struct Params {
    n: u32, decoupled: u32, phase: u32, _p1: u32,
    lr: f32, beta1: f32, beta2: f32, eps: f32,
    weight_decay: f32, bc1: f32, bc2_sqrt: f32, _p2: f32,
}

@group(0) @binding(0) var<storage, read_write> param: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> grad: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> m: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> v: array<{{T}}>;
@group(0) @binding(4) var<storage, read_write> a: array<{{T}}>;
@group(0) @binding(5) var<storage, read_write> b: array<{{T}}>;
@group(0) @binding(6) var<uniform> p: Params;
#accessors param grad m v a b
#include prelude

// Elements i and j (= i + 1, or i at the end) of word w: each invocation
// owns its pair, so it reads back what it stored (16-bit values rounded).
fn moments(w: u32, i: u32, j: u32) {
    let g = vec2<f32>(ld_grad(i), ld_grad(j));
    if (p.decoupled != 0u && p.weight_decay != 0.0) {
        st2_param(w, vec2<f32>(ld_param(i), ld_param(j)) * (1.0 - p.lr * p.weight_decay), p.n);
    }
    st2_m(w, p.beta1 * vec2<f32>(ld_m(i), ld_m(j)) + (1.0 - p.beta1) * g, p.n);
    st2_v(w, p.beta2 * vec2<f32>(ld_v(i), ld_v(j)) + (1.0 - p.beta2) * g * g, p.n);
}

fn denom(w: u32, i: u32, j: u32) {
    st2_a(w, sqrt(vec2<f32>(ld_v(i), ld_v(j))) / p.bc2_sqrt + p.eps, p.n);
}

fn apply(w: u32, i: u32, j: u32) {
    let d = vec2<f32>(ld_a(i), ld_a(j));
    let mi = vec2<f32>(ld_m(i), ld_m(j));
    st2_param(w, vec2<f32>(ld_param(i), ld_param(j)) - (p.lr / p.bc1) * mi / d, p.n);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {
    let w = flat_index(wid, nwg, lidx);
    let i = 2u * w;
    if (i >= p.n) { return; }
    let j = min(i + 1u, p.n - 1u);
    switch p.phase {
        case 0u: {
            st2_a(w, vec2<f32>(ld_grad(i), ld_grad(j)) + p.weight_decay * vec2<f32>(ld_param(i), ld_param(j)), p.n);
        }
        case 1u: {
            moments(w, i, j);
        }
        case 3u: {
            apply(w, i, j);
        }
        case 7u: {
            moments(w, i, j);
            denom(w, i, j);
            apply(w, i, j);
        }
        case 8u: {
            denom(w, i, j);
            apply(w, i, j);
        }
        case 4u: {
            st2_a(w, sqrt(vec2<f32>(ld_v(i), ld_v(j))), p.n);
        }
        case 5u: {
            st2_b(w, vec2<f32>(ld_a(i), ld_a(j)) / p.bc2_sqrt, p.n);
        }
        default: {
            st2_a(w, vec2<f32>(ld_a(i), ld_a(j)) + p.eps, p.n);
        }
    }
}
