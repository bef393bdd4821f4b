//! The snapshot reader streams: each trace entry becomes a compact record as
//! the pickle is parsed, and lists of shared frames are shared by content.
//! Differential: on every fixture snapshot, the streamed reading equals a
//! reading of the whole tree (entries kept as dicts, recorded afterwards).

use std::rc::Rc;
use vramlab_lab::pickle::{unpickle, unpickle_from, KeepDicts, PyValue};
use vramlab_lab::torch_snapshot::{read_all, read_parsed, Parsed, SnapshotFile};
use vramlab_lab::trace_entries::Entries;

fn snapshots() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut out = Vec::new();
    for dir in [
        root.join("snapshots"),
        root.join("recorder"),
        root.join("recorder/zoo"),
    ] {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "pickle") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn summary(f: &SnapshotFile) -> String {
    let mut s = format!("{:?} {}\n", f.settings, f.expandable_setting);
    for d in &f.devices {
        let mut origins: Vec<_> = d.origins.iter().collect();
        origins.sort_by_key(|(id, _)| **id);
        s += &format!(
            "{} {:?} {:?} {:?} {:?} {} {:?} {:?} {:?} {} {} {:?} {}\n",
            d.device,
            d.workload.ops,
            d.segment_allocs,
            d.segment_addresses,
            d.segment_frees,
            d.peak_allocated,
            d.categories_from_frames,
            d.recorded_end,
            d.ooms,
            d.expandable,
            d.unplaced_frees,
            origins,
            d.categories_from_metadata
        );
    }
    s
}

#[test]
fn streamed_reading_equals_the_whole_trees() {
    let mut compared = 0;
    for path in snapshots() {
        let name = path.display().to_string();
        let bytes = std::fs::read(&path).unwrap();
        let streamed = read_all(&bytes, &name);
        let mut whole = Parsed {
            root: unpickle(&bytes).unwrap(),
            entries: Entries::default(),
        };
        let from_tree = read_parsed(&mut whole, &name);
        match (streamed, from_tree) {
            (Ok(a), Ok(b)) => {
                assert_eq!(summary(&a), summary(&b), "{name}");
                compared += 1;
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{name}"),
            (a, b) => panic!("{name}: streamed {:?}, tree {:?}", a.is_ok(), b.is_ok()),
        }
    }
    assert!(compared >= 14, "only {compared} snapshots compared");
}

#[test]
fn entries_are_records_and_identical_stacks_one_list() {
    let bytes = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/snapshots/cs336_kkaitlyn_ctx128_fullstep.pickle"),
    )
    .unwrap();
    let mut entries = Entries::default();
    let root = unpickle_from(&bytes[..], bytes.len(), &mut entries).unwrap();
    let trace = root.get("device_traces").unwrap().as_list().unwrap()[0]
        .as_list()
        .unwrap();
    // Every entry is a record, none a dict.
    assert_eq!(entries.len(), trace.len());
    assert!(trace.iter().all(|e| matches!(e, PyValue::Int(_))));
    // The segments' blocks stay dicts, and their frames lists are shared
    // by content: every list of the same frames is one allocation.
    let mut lists: Vec<Rc<[PyValue]>> = Vec::new();
    for seg in root.get("segments").unwrap().as_list().unwrap() {
        for b in seg.get("blocks").unwrap().as_list().unwrap() {
            if let Some(PyValue::List(l)) = b.get("frames") {
                if !l.is_empty() {
                    lists.push(l.clone());
                }
            }
        }
    }
    assert!(!lists.is_empty());
    for a in &lists {
        for b in &lists {
            let same = a.len() == b.len()
                && a.iter().zip(b.iter()).all(|(x, y)| match (x, y) {
                    (PyValue::Dict(x), PyValue::Dict(y)) => Rc::ptr_eq(x, y),
                    _ => false,
                });
            assert_eq!(same, Rc::ptr_eq(a, b));
        }
    }
    // Without the hook the entries stay dicts.
    let tree = unpickle_from(&bytes[..], bytes.len(), &mut KeepDicts).unwrap();
    let t = tree.get("device_traces").unwrap().as_list().unwrap()[0]
        .as_list()
        .unwrap();
    assert!(t.iter().all(|e| e.get("action").is_some()));
}

#[test]
fn lists_of_plain_values_are_never_merged() {
    // pickle.dumps({'a': [1, 2], 'b': [1, 2]}, protocol=4): equal, unshared.
    let data = b"\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01K\x02e\x8c\x01b\x94]\x94(K\x01K\x02eu.";
    let v = unpickle(data).unwrap();
    let (PyValue::List(a), PyValue::List(b)) = (v.get("a").unwrap(), v.get("b").unwrap()) else {
        panic!("lists");
    };
    assert_eq!(a, b);
    assert!(!Rc::ptr_eq(a, b));
}

#[test]
fn allocations_on_two_streams_are_counted() {
    use vramlab_lab::pickle::pickle;
    let s = PyValue::str;
    let entry = |action: &str, addr: i64, stream: i64| {
        PyValue::dict(vec![
            (s("action"), s(action)),
            (s("addr"), PyValue::Int(addr)),
            (s("size"), PyValue::Int(1 << 20)),
            (s("stream"), PyValue::Int(stream)),
        ])
    };
    let trace = vec![
        entry("segment_alloc", 1 << 32, 0),
        entry("alloc", 1 << 32, 0),
        entry("alloc", (1 << 32) + (1 << 20), 7),
        entry("free_completed", 1 << 32, 0),
    ];
    let root = PyValue::dict(vec![
        (s("segments"), PyValue::list(vec![])),
        (
            s("device_traces"),
            PyValue::list(vec![PyValue::list(trace)]),
        ),
    ]);
    let file = read_all(&pickle(&root), "two streams").unwrap();
    assert_eq!(file.devices[0].streams, 2);
    let one = PyValue::dict(vec![
        (s("segments"), PyValue::list(vec![])),
        (
            s("device_traces"),
            PyValue::list(vec![PyValue::list(vec![entry("alloc", 1 << 32, 3)])]),
        ),
    ]);
    assert_eq!(
        read_all(&pickle(&one), "one").unwrap().devices[0].streams,
        1
    );
}
