//! The segment map of a replay's last moment equals the snapshot's own
//! segments, on every real snapshot and the recorder's fixtures whose
//! replay ends in the recorded state: the two readers of segments (the
//! pickle's and the allocator's) agree.

use vramlab_lab::segment_map::{segment_maps, segments_at};
use vramlab_lab::torch_snapshot::{read_all, replay_from_state};

fn fixture_dirs() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    vec![root.join("snapshots"), root.join("recorder")]
}

#[test]
fn a_replays_last_segments_equal_the_snapshots_own() {
    let mut checked = 0;
    for dir in fixture_dirs() {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_none_or(|x| x != "pickle") || path.ends_with("state_only.pickle")
            {
                continue;
            }
            let name = path.display().to_string();
            let bytes = std::fs::read(&path).unwrap();
            let file = read_all(&bytes, &name).unwrap();
            let maps = segment_maps(&bytes, &name).unwrap();
            for snap in &file.devices {
                let mut cfg = file.settings.clone().unwrap_or_default();
                cfg.expandable_segments |= snap.expandable || file.expandable_setting;
                let r = replay_from_state(snap, cfg.clone(), None).unwrap();
                if !r.segments_match {
                    continue;
                }
                let last = snap.workload.ops.len().saturating_sub(1);
                let replayed = segments_at(snap, cfg, None, last).unwrap();
                let own = maps.iter().find(|m| m.device == snap.device).unwrap();
                let what = format!("{name} device {}", snap.device);
                assert_eq!(replayed.segments, own.segments, "{what}");
                assert_eq!(replayed.reserved_bytes, own.reserved_bytes, "{what}");
                assert_eq!(replayed.allocated_bytes, own.allocated_bytes, "{what}");
                assert_eq!(
                    replayed.reserved_bytes,
                    replayed.allocated_bytes + replayed.free_external_bytes,
                    "{what}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "{checked} devices checked");
}
