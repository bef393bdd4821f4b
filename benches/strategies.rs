//! Cost per allocator operation for every strategy, on one synthetic
//! workload (variable-length batches, ~4,900 operations) over a simulated
//! device: the same trace, so the times compare as ratios. Then the
//! replay path of `pytorch`, `expandable` and `vramlab` on the real PyTorch
//! snapshots in tests/fixtures (one training step each, recorded on CUDA
//! GPUs): the whole trace per iteration, timed as `replay --json` times it
//! (the replay loop only: building the strategy, the trace's lower bound
//! and dropping the allocator afterwards are left out), so criterion's
//! throughput is operations per second of the replay path.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;
use vramlab::lab::strategies::{online, online_configured, NAMES};
use vramlab::lab::synthetic;
use vramlab::lab::torch_snapshot::read_all;
use vramlab::lab::workload::{run, run_planner};

fn strategies(c: &mut Criterion) {
    let w = synthetic::variable_length_batches();
    let mut g = c.benchmark_group("strategy_whole_trace");
    g.sample_size(20);
    for name in NAMES {
        g.bench_function(name, |b| {
            b.iter(|| {
                if name == "planner" {
                    run_planner(&w, None).peak_reserved_bytes
                } else {
                    let mut s = online(name, None).expect("known strategy");
                    run(s.as_mut(), &w).peak_reserved_bytes
                }
            })
        });
    }
    g.finish();
}

/// The real recordings the repository holds.
const REAL: [&str; 3] = [
    "tests/fixtures/snapshots/cs336_kkaitlyn_ctx128_fullstep.pickle",
    "tests/fixtures/snapshots/ftcourse_memory_snapshot.pickle",
    "tests/fixtures/recorder/h200-torch2.11-gpt2-bf16.cuda.pickle",
];

fn real_snapshots(c: &mut Criterion) {
    let mut g = c.benchmark_group("replay_real_snapshot");
    g.sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for path in REAL {
        let bytes = std::fs::read(path).expect("fixture");
        let file = read_all(&bytes, path).expect("snapshot");
        let snap = &file.devices[0];
        let config = file.settings.clone().unwrap_or_default();
        let w = &snap.workload;
        // Throughput in elements: criterion prints operations per second.
        g.throughput(Throughput::Elements(w.ops.len() as u64));
        let short = path.rsplit('/').next().unwrap_or(path);
        for name in ["pytorch", "expandable", "vramlab"] {
            g.bench_function(format!("{name}/{short}"), |b| {
                b.iter_custom(|iters| {
                    let mut loop_time = Duration::ZERO;
                    for _ in 0..iters {
                        let mut s = online_configured(name, None, &config).expect("strategy");
                        let r = run(s.as_mut(), w);
                        loop_time +=
                            Duration::from_secs_f64(r.ns_per_op * w.ops.len() as f64 * 1e-9);
                    }
                    loop_time
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, strategies, real_snapshots);
criterion_main!(benches);
