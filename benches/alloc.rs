//! Cost of one allocation + free:
//! - on the cached path (simulated source, the block comes from the pool);
//! - on the cached path over real wgpu buffers (same code, wgpu source);
//! - with a fresh wgpu buffer per tensor (what no caching costs; PyTorch's
//!   PYTORCH_NO_CUDA_MEMORY_CACHING=1).
//!
//! The wgpu benches need an adapter (lavapipe works) and are skipped without.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;
use vramlab::device::{AdapterOptions, Gpu, WgpuSource};
use vramlab::memory::{AllocatorConfig, CachingAllocator, SimulatedSource};

const SIZES: &[u64] = &[4096, 4 << 20];

fn cached_simulated(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc_free_cached_simulated");
    for &size in SIZES {
        let mut a =
            CachingAllocator::new(SimulatedSource::new(64 << 30), AllocatorConfig::default());
        // Some live neighbours so the pools are not trivially empty.
        let _keep: Vec<_> = (0..64)
            .map(|i| a.malloc(1000 + i * 512, "keep").unwrap())
            .collect();
        let warm = a.malloc(size, "warm").unwrap();
        a.free(warm.handle).unwrap();
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let x = a.malloc(black_box(size), "t").unwrap();
                a.free(x.handle).unwrap();
            })
        });
    }
    g.finish();
}

fn wgpu_paths(c: &mut Criterion) {
    let gpu = match Gpu::new(&AdapterOptions::default()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipping wgpu alloc benches: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("alloc_free_wgpu");
    for &size in SIZES {
        let source = WgpuSource::of(&gpu);
        let mut a = CachingAllocator::new(source, AllocatorConfig::default());
        let warm = a.malloc(size, "warm").unwrap();
        a.free(warm.handle).unwrap();
        g.bench_with_input(BenchmarkId::new("cached", size), &size, |b, &size| {
            b.iter(|| {
                let x = a.malloc(black_box(size), "t").unwrap();
                a.free(x.handle).unwrap();
            })
        });
        g.bench_with_input(BenchmarkId::new("fresh_buffer", size), &size, |b, &size| {
            b.iter(|| {
                let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: black_box(size),
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_DST
                        | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                drop(buf);
            })
        });
    }
    g.finish();
    let _ = gpu.synchronize();
}

criterion_group!(benches, cached_simulated, wgpu_paths);
criterion_main!(benches);
