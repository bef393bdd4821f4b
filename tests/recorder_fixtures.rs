//! Steps recorded by `python/vramlab_torch` on fake tensors (fixtures its
//! tests regenerate) replay to the recorded end state, and the prediction
//! replay prints holds together: the peak's breakdown sums to the peak, every
//! allocation carries the recorder's category, and a device too small for
//! the step runs out where the breakdown says.

use vramlab::lab::torch_snapshot::{read_all, replay_from_state};
use vramlab::memory::caching::{allocation_size, round_size};
use vramlab::memory::AllocatorConfig;

const FIXTURES: [&str; 3] = [
    "mlp-adamw.pickle",
    "gpt-block-adamw.pickle",
    "gpt-tiny-bf16-checkpoint.pickle",
];

fn read(name: &str) -> vramlab::lab::torch_snapshot::SnapshotFile {
    let path = format!(
        "{}/tests/fixtures/recorder/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    read_all(&std::fs::read(&path).unwrap(), name).unwrap()
}

#[test]
fn recorded_steps_replay_to_their_end_state_with_a_breakdown_that_sums() {
    for name in FIXTURES {
        let file = read(name);
        assert_eq!(file.devices.len(), 1, "{name}");
        let snap = &file.devices[0];
        let config = file.settings.clone().unwrap_or_default();
        assert_eq!(
            snap.categories_from_metadata,
            snap.workload.allocations(),
            "{name}: every allocation names its category"
        );
        let r = replay_from_state(snap, config, None).unwrap();
        assert!(r.segments_match, "{name}: {:?}", r.differences);
        assert_eq!(r.ooms, 0, "{name}");
        let peak = &r.at_peak;
        assert_eq!(peak.allocated_bytes, r.peak_allocated_bytes, "{name}");
        let by_category: u64 = peak.by_category.iter().map(|c| c.1).sum();
        assert_eq!(
            by_category + peak.before_recording_bytes,
            peak.allocated_bytes
        );
        assert!(!peak.by_module.is_empty(), "{name}: modules named");
        assert!(
            peak.by_category.iter().any(|(c, _)| c == "parameter"),
            "{name}: parameters are live at the peak"
        );
    }
}

#[test]
fn a_device_too_small_runs_out_and_says_what_was_live() {
    let file = read("gpt-tiny-bf16-checkpoint.pickle");
    let snap = &file.devices[0];
    let config = file.settings.clone().unwrap_or_default();
    let whole = replay_from_state(snap, config.clone(), None).unwrap();
    let capacity = whole.peak_reserved_bytes / 2;
    let small = replay_from_state(snap, AllocatorConfig { ..config }, Some(capacity)).unwrap();
    assert!(small.ooms > 0);
    let first = &small.oom_at[0];
    let segment = allocation_size(round_size(
        first.requested_bytes,
        &AllocatorConfig::default(),
    ));
    assert!(
        first.reserved_bytes + segment > capacity,
        "it failed because its segment did not fit"
    );
    let live = small.at_first_oom.as_ref().unwrap();
    assert_eq!(live.allocated_bytes, first.allocated_bytes);
    assert!(
        first.origin.module.is_some(),
        "the refused allocation names its module"
    );
}
