//! Quick tiled-vs-naive matmul timing without criterion:
//! `cargo run --release --example matmul_speed -- 1024`.

use std::time::Instant;
use vramlab::device::AdapterOptions;
use vramlab::memory::AllocatorConfig;
use vramlab::ops::matmul::{matmul_ex, MatmulKernel};
use vramlab::tensor::{Engine, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(512);
    let e = Engine::new(&AdapterOptions::default(), AllocatorConfig::default())?;
    let data: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 / 17.0).collect();
    let a = Tensor::from_slice(&e, &data, &[n, n], "a")?;
    let b = Tensor::from_slice(&e, &data, &[n, n], "b")?;
    for kernel in [MatmulKernel::Tiled, MatmulKernel::Naive] {
        drop(matmul_ex(&a, &b, false, false, kernel)?);
        e.synchronize()?;
        let reps = 3;
        let s = Instant::now();
        for _ in 0..reps {
            drop(matmul_ex(&a, &b, false, false, kernel)?);
            e.synchronize()?;
        }
        let t = s.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{kernel:?} {n}^3: {:.3} s, {:.2} GFLOP/s",
            t,
            2.0 * (n as f64).powi(3) / t / 1e9
        );
    }
    Ok(())
}
