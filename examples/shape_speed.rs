//! Time one product shape under several tiles, interleaved rep by rep
//! (device timestamps where the adapter has them): for trying an idea on
//! one of the shapes `vramlab bench` lists.
//! Prints each tile's median time, then each dispatch it ran (the kernel
//! variant's name: vec4, one slice, …) with its own median.
//! `cargo run --release --example shape_speed -- M N K [at] [bt] [ashared] [reduce] [batch=B]
//! [conv=C,H,W,KH,KW,S,P,WO,T] [reps=R] -- TILE...`
//! where a TILE is `WX,WY,TM,TN,BK,shared|direct[,strided][,sgA][,vec4][,T]` or `chosen`
//! (`T`: run as Cᵀ = Bᵀ·Aᵀ).

use std::time::Instant;
use vramlab::device::AdapterOptions;
use vramlab::memory::AllocatorConfig;
use vramlab::ops::matmul::{gemm, ConvGeometry, GemmShape, MatmulKernel, TileConfig};
use vramlab::tensor::{Engine, Tensor};

fn tile(spec: &str) -> Result<MatmulKernel, Box<dyn std::error::Error>> {
    if spec == "chosen" {
        return Ok(MatmulKernel::Tiled);
    }
    let f: Vec<&str> = spec.split(',').collect();
    if f.len() < 6 {
        return Err(format!(
            "tile {spec:?}: want WX,WY,TM,TN,BK,shared|direct[,strided][,sgA][,vec4][,T]"
        )
        .into());
    }
    let n = |i: usize| f[i].parse::<u32>();
    let mut t = TileConfig::new(n(0)?, n(1)?, n(2)?, n(3)?, n(4)?, f[5] == "shared");
    t.strided_cols = f[6..].contains(&"strided");
    t.subgroup_a = f[6..].contains(&"sgA");
    t.vec4 = f[6..].contains(&"vec4");
    if f[6..].contains(&"T") {
        return Ok(MatmulKernel::FixedTransposed(t));
    }
    Ok(MatmulKernel::Fixed(t))
}

/// The middle of `times` (NaN for none).
fn median(times: &[f64]) -> f64 {
    let mut t = times.to_vec();
    t.sort_by(|x, y| x.total_cmp(y));
    t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or("usage: M N K [at] [bt] [ashared] [reduce] [batch=B] [conv=C,H,W,KH,KW,S,P,WO,T] [reps=R] -- TILE...")?;
    let (shape_args, tiles) = (&args[..split], &args[split + 1..]);
    let opt = |p: &str| {
        shape_args
            .iter()
            .find_map(|a| a.strip_prefix(p).map(str::to_string))
    };
    let num = |i: usize| {
        shape_args
            .get(i)
            .ok_or("M N K needed")
            .map(|s| s.parse::<usize>())
    };
    let shape = GemmShape {
        op: "shape".into(),
        m: num(0)??,
        n: num(1)??,
        k: num(2)??,
        batch: opt("batch=").map(|b| b.parse()).transpose()?.unwrap_or(1),
        a_transposed: shape_args.iter().any(|a| a == "at"),
        b_transposed: shape_args.iter().any(|a| a == "bt"),
        a_shared: shape_args.iter().any(|a| a == "ashared"),
        b_shared: false,
        reduce_batch: shape_args.iter().any(|a| a == "reduce"),
        conv: opt("conv=")
            .map(|c| -> Result<ConvGeometry, Box<dyn std::error::Error>> {
                let v = c
                    .split(',')
                    .map(|x| x.parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()?;
                if v.len() != 9 {
                    return Err("conv=C,H,W,KH,KW,STRIDE,PAD,WO,TRANSPOSED(0|1)".into());
                }
                Ok(ConvGeometry {
                    c: v[0],
                    h: v[1],
                    w: v[2],
                    kh: v[3],
                    kw: v[4],
                    stride: v[5],
                    pad: v[6],
                    wo: v[7],
                    transposed: v[8] == 1,
                    flipped: false,
                })
            })
            .transpose()?,
    };
    let reps = shape_args
        .iter()
        .filter_map(|a| a.strip_prefix("reps="))
        .next()
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(7usize)
        .max(1);
    let kernels = tiles
        .iter()
        .map(|t| tile(t))
        .collect::<Result<Vec<_>, _>>()?;
    let e = Engine::new(&AdapterOptions::default(), AllocatorConfig::default())?;
    let source = e.start_timing();
    println!("{:?}", source);
    let (na, nb, nc) = shape.sizes();
    let fill = |n: usize| (0..n).map(|i| (i % 13) as f32 / 13.0).collect::<Vec<f32>>();
    let a = Tensor::from_slice(&e, &fill(na), &[na], "a")?;
    let b = Tensor::from_slice(&e, &fill(nb), &[nb], "b")?;
    let c = Tensor::from_slice(&e, &vec![0.0; nc], &[nc], "c")?;
    let g = shape.gemm();
    let mut times = vec![Vec::new(); kernels.len()];
    // The dispatches each tile ran (the variant's name: vec4, one slice, …)
    // and each one's times.
    let mut ran: Vec<Vec<(String, Vec<f64>)>> = vec![Vec::new(); kernels.len()];
    for rep in 0..=reps {
        for (i, k) in kernels.iter().enumerate() {
            e.take_dispatch_times()?;
            let t0 = Instant::now();
            gemm(&g, &a, &b, &c, *k)?;
            e.synchronize()?;
            let wall = t0.elapsed().as_secs_f64();
            let dispatches = e.take_dispatch_times()?.map(|(_, t)| t);
            let dev = dispatches
                .as_ref()
                .map(|t| t.iter().map(|d| d.seconds).sum::<f64>())
                .unwrap_or(wall);
            if rep == 0 {
                ran[i] = dispatches
                    .iter()
                    .flatten()
                    .map(|d| (d.kernel.clone(), Vec::new()))
                    .collect();
            } else {
                for ((_, ts), d) in ran[i].iter_mut().zip(dispatches.iter().flatten()) {
                    ts.push(d.seconds);
                }
                times[i].push(dev);
            }
        }
    }
    for ((t, spec), ran) in times.iter().zip(tiles).zip(&ran) {
        let med = median(t);
        println!(
            "{spec:<32} {:>9.3} ms {:>8.2} GFLOP/s",
            med * 1e3,
            shape.flops() / med / 1e9
        );
        for (kernel, ts) in ran {
            println!("    {:>9.3} ms  {kernel}", median(ts) * 1e3);
        }
    }
    Ok(())
}
