//! Does the adapter pay per access or per byte? Writes and reads 16M floats
//! as scalars (one or four per thread) and as vec4s, wall-clocked around
//! each dispatch, interleaved. On llvmpipe a vec4 store costs 0.98 ns per
//! float where four scalar stores cost 1.36, and a vec4 load 0.76 where a
//! scalar one costs 1.42: why the matmul family loads B and stores C as
//! vec4 where it can (`shaders/matmul.wgsl`, VEC_B / VEC_C).
//! `cargo run --release --example store_width`
use std::time::Instant;
use vramlab::device::{AdapterOptions, Kernel};
use vramlab::memory::AllocatorConfig;
use vramlab::ops::launch;
use vramlab::tensor::{DType, Engine, Tensor};

const SRC: &str = r#"
struct Params { n: u32, value: f32, _p0: u32, _p1: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;
#include prelude
@compute @workgroup_size(256)
fn scalar(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n) { return; }
    out[i] = p.value + f32(i);
    if (i == 0xffffffffu) { out4[0] = vec4<f32>(0.0); }
}
@compute @workgroup_size(256)
fn vector(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n / 4u) { return; }
    let v = p.value + f32(i);
    out4[i] = vec4<f32>(v, v + 1.0, v + 2.0, v + 3.0);
    if (i == 0xffffffffu) { out[0] = 0.0; }
}
@compute @workgroup_size(256)
fn four(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n / 4u) { return; }
    let v = p.value + f32(i);
    out[4u * i] = v; out[4u * i + 1u] = v + 1.0; out[4u * i + 2u] = v + 2.0; out[4u * i + 3u] = v + 3.0;
    if (i == 0xffffffffu) { out4[0] = vec4<f32>(0.0); }
}
@compute @workgroup_size(256)
fn rd_scalar(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n / 16u) { return; }
    var s = 0.0;
    for (var j = 0u; j < 16u; j++) { s += out[i + j * (p.n / 16u)]; }
    out[i] = s;
    if (i == 0xffffffffu) { out4[0] = vec4<f32>(0.0); }
}
@compute @workgroup_size(256)
fn rd_vector(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {
    let i = flat_index(wid, nwg, lidx);
    if (i >= p.n / 16u) { return; }
    var s = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) { s += out4[i + j * (p.n / 16u)]; }
    out[i] = s.x + s.y + s.z + s.w;
    if (i == 0xffffffffu) { out4[0] = vec4<f32>(0.0); }
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let e = Engine::new(&AdapterOptions::default(), AllocatorConfig::default())?;
    let n = 1usize << 24;
    let t = Tensor::empty(&e, &[n], DType::F32, "out")?;
    let src: &'static str = SRC;
    let params: [u32; 4] = [n as u32, 1.0f32.to_bits(), 0, 0];
    let ks: Vec<(&str, usize)> = vec![
        ("scalar", n),
        ("vector", n / 4),
        ("four", n / 4),
        ("rd_scalar", n / 16),
        ("rd_vector", n / 16),
    ];
    for rep in 0..4 {
        for (name, threads) in &ks {
            let k = Kernel::fixed(name, src, name);
            e.synchronize()?;
            let s = Instant::now();
            launch(
                &t,
                &k,
                &[&t.slice(), &t.slice()],
                bytemuck::cast_slice(&params),
                *threads,
            )?;
            e.synchronize()?;
            if rep > 0 {
                println!(
                    "{name:10} {:8.2} ms  ({:.2} ns per float)",
                    s.elapsed().as_secs_f64() * 1e3,
                    s.elapsed().as_secs_f64() * 1e9 / n as f64
                );
            }
        }
    }
    Ok(())
}
