//! Cost per allocator operation for every strategy, on one synthetic
//! workload (variable-length batches, ~4,900 operations) over a simulated
//! device: the same trace, so the times compare as ratios.

use criterion::{criterion_group, criterion_main, Criterion};
use vramlab::lab::strategies::{online, NAMES};
use vramlab::lab::synthetic;
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

criterion_group!(benches, strategies);
criterion_main!(benches);
