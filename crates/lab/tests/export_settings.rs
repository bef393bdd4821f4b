//! A run exported as a PyTorch snapshot carries the settings it ran under
//! (roundup divisions, vramlab's own options, the memory limit garbage
//! collection acts against), so replaying the file under what it says
//! reaches the run's own end state: replay = recording, over generated
//! settings and traces.

use proptest::prelude::*;
use vramlab_lab::memory::*;
use vramlab_lab::pickle::pickle;
use vramlab_lab::strategies::vramlab::parse_alloc_conf;
use vramlab_lab::{snapshot_export, torch_snapshot};

const MIB: u64 = 1 << 20;

/// One alloc-conf option a run may have; empty means none.
fn option() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(""),
        Just("roundup_power2_divisions:4"),
        Just("roundup_power2_divisions:[1:2,4:8,>:1]"),
        Just("max_split_size_mb:24"),
        Just("garbage_collection_threshold:0.5"),
        Just("small_from_large:True"),
        Just("release_before_grow:True"),
        Just("lookahead:True"),
        Just("expandable_segments:True"),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    Alloc(u64),
    Free(usize),
    EmptyCache,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let size = prop_oneof![1u64..4096, 4096..MIB, MIB..12 * MIB, 12 * MIB..40 * MIB];
    let step = prop_oneof![
        6 => size.prop_map(Step::Alloc),
        4 => any::<usize>().prop_map(Step::Free),
        1 => Just(Step::EmptyCache),
    ];
    prop::collection::vec(step, 1..120)
}

/// Runs `steps` under `options` (and a memory limit), exports the run and
/// replays the file under the settings it carries.
fn round_trip(
    options: &[&str],
    limit_mib: Option<u64>,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let conf: Vec<&str> = options.iter().copied().filter(|o| !o.is_empty()).collect();
    let mut config = parse_alloc_conf(&conf.join(",")).unwrap();
    config.memory_limit = limit_mib.map(|m| m * MIB);
    // Where garbage collection or release_before_grow governs releases,
    // the reader follows that rule and cannot tell a program's own
    // empty_cache apart from it (torch_snapshot::releases_mean_empty_cache).
    let own_empty_cache = torch_snapshot::releases_mean_empty_cache(&config);
    let mut a = CachingAllocator::new(SimulatedSource::unlimited(), config.clone());
    a.start_recording();
    let mut live = Vec::new();
    for s in steps.iter().cloned() {
        match s {
            // A refusal under the limit is part of the run.
            Step::Alloc(size) => live.extend(a.malloc(size, "t").ok().map(|x| x.handle)),
            Step::Free(k) if !live.is_empty() => {
                let h = live.swap_remove(k % live.len());
                a.free(h).unwrap();
            }
            Step::Free(_) => {}
            Step::EmptyCache if own_empty_cache => a.empty_cache(),
            Step::EmptyCache => {}
        }
    }
    let events = a.take_events();
    if events.is_empty() {
        // Nothing happened: a snapshot with no history, which the
        // reader refuses as such.
        return Ok(());
    }
    let bytes = pickle(&snapshot_export::torch_snapshot(&events, &config));
    let file = torch_snapshot::read_all(&bytes, "export").unwrap();
    let read = file.settings.clone().unwrap();
    prop_assert_eq!(read.describe(), config.describe());
    prop_assert_eq!(read.memory_limit, config.memory_limit);
    let snap = &file.devices[0];
    let r = torch_snapshot::replay_from_state(snap, read, None).unwrap();
    prop_assert!(
        r.segments_match,
        "{:?} under {}",
        r.differences,
        config.describe()
    );
    prop_assert_eq!(r.replayed.reserved_bytes, a.memory_reserved());
    prop_assert_eq!(r.replayed.allocated_bytes, a.memory_allocated());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn an_exported_run_replays_under_the_settings_it_carries(
        options in prop::collection::vec(option(), 1..4),
        limit_mib in prop::option::of(64u64..400),
        steps in steps(),
    ) {
        round_trip(&options, limit_mib, &steps)?;
    }
}

/// An expandable pool released whole by empty_cache maps its next pages in
/// a new segment elsewhere. The reader gave the large pool's new map to the
/// small pool, whose span it lay in, so a run recorded from its start came
/// back with a range "mapped before it", which the rebuild refused as not
/// whole pages.
#[test]
fn an_expandable_pool_reserved_again_after_empty_cache_replays() {
    use Step::*;
    let steps = [
        Alloc(MIB + 1),
        Free(0),
        Alloc(1),
        Free(0),
        EmptyCache,
        Alloc(MIB + 1),
        Alloc(1),
        Alloc(505),
        Free(7),
        Alloc(3609),
    ];
    round_trip(&["expandable_segments:True"], None, &steps).unwrap();
}
