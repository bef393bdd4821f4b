//! The page's summary of a replay keeps what matters however long the
//! trace: on every fixture snapshot, at any bucket count, the highest
//! bucket is the replay's peak allocated and reserved, bucket totals by
//! category add up to the allocated bytes, and each captured moment's
//! segments hold exactly what a replay up to that operation holds.

use vramlab_lab::segment_map::segments_at;
use vramlab_lab::timeline::timeline;
use vramlab_lab::torch_snapshot::{read_all, replay_from_state};

#[test]
fn buckets_keep_the_peaks_and_moments_the_segments() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut checked = 0;
    for dir in [root.join("snapshots"), root.join("recorder/zoo")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_none_or(|x| x != "pickle") || path.ends_with("state_only.pickle")
            {
                continue;
            }
            let name = path.display().to_string();
            let file = read_all(&std::fs::read(&path).unwrap(), &name).unwrap();
            for snap in &file.devices {
                let mut cfg = file.settings.clone().unwrap_or_default();
                cfg.expandable_segments |= snap.expandable || file.expandable_setting;
                let r = replay_from_state(snap, cfg.clone(), None).unwrap();
                let n = snap.workload.ops.len();
                for points in [7, 100, n.max(1)] {
                    let what = format!("{name} device {} at {points} points", snap.device);
                    let capture = [r.at_peak.after_op, n / 3];
                    let t = timeline(snap, cfg.clone(), None, points, &capture, 3).unwrap();
                    assert!(t.buckets.len() <= points, "{what}");
                    assert_eq!(t.buckets.len(), n.div_ceil(t.per_bucket), "{what}");
                    if points >= n {
                        assert_eq!(t.per_bucket, 1, "{what}");
                    }
                    let amax = t.buckets.iter().map(|b| b.allocated_max).max().unwrap();
                    let rmax = t.buckets.iter().map(|b| b.reserved_max).max().unwrap();
                    assert_eq!(amax, r.peak_allocated_bytes, "{what}");
                    assert_eq!(rmax, r.peak_reserved_bytes, "{what}");
                    assert_eq!(t.peak_op, r.at_peak.after_op, "{what}");
                    for b in &t.buckets {
                        assert_eq!(b.by_category.iter().sum::<u64>(), b.allocated_max, "{what}");
                        assert!(b.allocated_min <= b.allocated_max, "{what}");
                    }
                    assert!(t.moments.iter().any(|m| m.op == r.at_peak.after_op));
                    for m in &t.moments {
                        let map = segments_at(snap, cfg.clone(), None, m.op).unwrap();
                        let reserved: u64 = m.segments.iter().map(|s| s.size).sum();
                        let allocated: u64 = m
                            .segments
                            .iter()
                            .map(|s| {
                                s.other_allocated + s.blocks.iter().map(|b| b.size).sum::<u64>()
                            })
                            .sum();
                        assert_eq!(reserved, map.reserved_bytes, "{what} op {}", m.op);
                        assert_eq!(allocated, map.allocated_bytes, "{what} op {}", m.op);
                        assert_eq!(m.segments.len(), map.segments, "{what} op {}", m.op);
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{checked}");
}
