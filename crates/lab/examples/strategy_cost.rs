//! Cost per operation of allocator strategies on PyTorch snapshots: each
//! strategy replays each device's trace `REPS` times; the best run's ns/op
//! is printed (what `replay --allocators --json` reports, without the noise
//! of one run). For profiling: `perf record` this.
//!
//! cargo run --release -p vramlab-lab --example strategy_cost -- REPS NAMES FILE...

use vramlab_lab::strategies::online_configured;
use vramlab_lab::torch_snapshot::read_all;
use vramlab_lab::workload::run;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reps: usize = args[0].parse().expect("REPS");
    let names: Vec<&str> = args[1].split(',').collect();
    for path in &args[2..] {
        let bytes = std::fs::read(path).expect("read");
        let file = read_all(&bytes, path).expect("snapshot");
        for snap in &file.devices {
            let mut config = file.settings.clone().unwrap_or_default();
            if snap.expandable || file.expandable_setting {
                config.expandable_segments = true;
            }
            print!("{path}:{} ({} ops)", snap.device, snap.workload.ops.len());
            for name in &names {
                let mut best = f64::INFINITY;
                let mut peak = 0;
                for _ in 0..reps {
                    let mut s = online_configured(name, None, &config).expect("strategy");
                    let r = run(s.as_mut(), &snap.workload);
                    best = best.min(r.ns_per_op);
                    peak = r.peak_reserved_bytes;
                }
                print!("  {name} {best:.1} ns/op ({peak} B)");
            }
            println!();
        }
    }
}
