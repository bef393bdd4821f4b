//! Matmul throughput, tiled vs naive, at 256³, 512³ and 1024³, in GFLOP/s
//! (criterion's "elem/s" counts FLOPs here: 2·n³ per product). After the
//! criterion groups, prints the tiled/naive ratio per size measured in this
//! same run, which is the figure to compare (absolute numbers depend on the
//! machine). Needs a GPU adapter (lavapipe works); without one it says so and
//! skips.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::{Duration, Instant};
use vramlab::device::AdapterOptions;
use vramlab::memory::AllocatorConfig;
use vramlab::ops::matmul::{matmul_ex, MatmulKernel};
use vramlab::tensor::{Engine, Tensor};

fn sizes() -> Vec<usize> {
    match std::env::var("VRAMLAB_BENCH_SIZES") {
        Ok(s) => s.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => vec![256, 512, 1024],
    }
}

fn inputs(e: &Engine, n: usize) -> (Tensor, Tensor) {
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 13.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) / 11.0)
        .collect();
    (
        Tensor::from_slice(e, &a, &[n, n], "a").expect("upload a"),
        Tensor::from_slice(e, &b, &[n, n], "b").expect("upload b"),
    )
}

fn run_once(e: &Engine, a: &Tensor, b: &Tensor, kernel: MatmulKernel) {
    let c = matmul_ex(a, b, false, false, kernel).expect("matmul");
    drop(c);
    e.synchronize().expect("sync");
}

fn bench(c: &mut Criterion) {
    let e = match Engine::new(&AdapterOptions::default(), AllocatorConfig::default()) {
        Ok(e) => e,
        Err(err) => {
            eprintln!("skipping matmul benches: {err}");
            return;
        }
    };
    eprintln!("adapter: {} ({})", e.device_name(), e.backend_name());
    let mut ratios = Vec::new();
    for n in sizes() {
        let (a, b) = inputs(&e, n);
        let flops = 2 * (n as u64).pow(3);
        let mut g = c.benchmark_group(format!("matmul_{n}"));
        g.throughput(Throughput::Elements(flops));
        g.sample_size(10);
        g.warm_up_time(Duration::from_millis(200));
        g.measurement_time(Duration::from_secs(if n >= 1024 { 20 } else { 5 }));
        for (name, kernel) in [
            ("tiled", MatmulKernel::Tiled),
            ("naive", MatmulKernel::Naive),
        ] {
            g.bench_function(name, |bch| bch.iter(|| run_once(&e, &a, &b, kernel)));
        }
        g.finish();
        // The same comparison as a median of a few runs, for the summary line.
        let median = |kernel| {
            run_once(&e, &a, &b, kernel);
            let mut t: Vec<f64> = (0..5)
                .map(|_| {
                    let s = Instant::now();
                    run_once(&e, &a, &b, kernel);
                    s.elapsed().as_secs_f64()
                })
                .collect();
            t.sort_by(|x, y| x.total_cmp(y));
            t[2]
        };
        let (tiled, naive) = (median(MatmulKernel::Tiled), median(MatmulKernel::Naive));
        ratios.push((n, flops as f64 / tiled / 1e9, flops as f64 / naive / 1e9));
    }
    eprintln!("\nmatmul summary (median of 5, same run):");
    for (n, t, nv) in ratios {
        eprintln!(
            "  {n:>5}^3  tiled {t:8.2} GFLOP/s   naive {nv:8.2} GFLOP/s   tiled/naive {:6.1}x",
            t / nv
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
