//! Time one tile shape of the matmul family at n³ (wall clock, median of 3):
//! `cargo run --release --example matmul_speed -- 1024 [WX WY TM TN BK shared|direct strided|contiguous [sgA]]`.
//! Without a tile, the chosen one and the naive kernel. `vramlab bench --tune`
//! sweeps a whole grid; this is for trying one idea quickly.

use std::time::Instant;
use vramlab::device::AdapterOptions;
use vramlab::memory::AllocatorConfig;
use vramlab::ops::matmul::{matmul_ex, MatmulKernel, TileConfig};
use vramlab::tensor::{Engine, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(512);
    let kernels = if args.len() >= 8 {
        let num = |i: usize| -> Result<u32, Box<dyn std::error::Error>> { Ok(args[i].parse()?) };
        let mut t = TileConfig::new(
            num(1)?,
            num(2)?,
            num(3)?,
            num(4)?,
            num(5)?,
            args[6] == "shared",
        );
        t.strided_cols = args[7] == "strided";
        t.subgroup_a = args.get(8).is_some_and(|a| a == "sgA");
        vec![MatmulKernel::Fixed(t)]
    } else {
        vec![MatmulKernel::Tiled, MatmulKernel::Naive]
    };
    let e = Engine::new(&AdapterOptions::default(), AllocatorConfig::default())?;
    let data: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 / 17.0).collect();
    let a = Tensor::from_slice(&e, &data, &[n, n], "a")?;
    let b = Tensor::from_slice(&e, &data, &[n, n], "b")?;
    for kernel in kernels {
        drop(matmul_ex(&a, &b, false, false, kernel)?);
        e.synchronize()?;
        let mut times: Vec<f64> = (0..3)
            .map(|_| {
                let s = Instant::now();
                drop(matmul_ex(&a, &b, false, false, kernel));
                let _ = e.synchronize();
                s.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(|x, y| x.total_cmp(y));
        let t = times[1];
        println!(
            "{kernel:?} {n}^3: {:.3} s, {:.2} GFLOP/s",
            t,
            2.0 * (n as f64).powi(3) / t / 1e9
        );
    }
    Ok(())
}
