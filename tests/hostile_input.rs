//! Hostile input, generated: traces, snapshot pickles, safetensors files,
//! allocator options and numeric flags built to break things (sizes at and
//! past 2^62 and 2^64, overflowing shapes, NaN, deep nesting, unknown ids,
//! binary junk). Each must end in a named error or a clean result — never a
//! panic, never a signal, never unbounded memory: the command-line cases
//! run the real binary under a 2 GiB address-space limit and a time limit,
//! and must exit 0, 1 or 2 with no "panicked" on stderr.

use crate::common::cli::{stderr, stdout};
use proptest::prelude::*;
use std::io::Cursor;
use std::process::Command;
use vramlab::io::SafeTensors;
use vramlab::lab::pickle::{pickle, unpickle, PyValue};
use vramlab::lab::replay::replay;
use vramlab::lab::torch_snapshot;
use vramlab::lab::workload::Workload;
use vramlab::memory::{AllocatorConfig, CachingAllocator, SimulatedSource};

/// Cases per property: the default keeps CI quick; HOSTILE_CASES=N runs
/// more.
fn cases(default: u32) -> u32 {
    std::env::var("HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Sizes that probe every boundary: tiny, the pools' edges, 2^62 (the most
/// vramlab models) and beyond, and u64::MAX.
fn hostile_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(512),
        Just(1 << 20),
        Just((1 << 20) + 1),
        Just(10 << 20),
        Just((1u64 << 62) - 1),
        Just(1u64 << 62),
        Just((1u64 << 62) + 1),
        Just(1u64 << 63),
        Just(u64::MAX),
        any::<u64>(),
        0u64..(64 << 20),
    ]
}

/// One trace line: well-formed events with hostile numbers, or junk.
fn hostile_line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u64..8, hostile_size()).prop_map(|(id, size)| format!(r#"{{"op":"alloc","id":{id},"size":{size}}}"#)),
        3 => (0u64..8).prop_map(|id| format!(r#"{{"op":"free","id":{id}}}"#)),
        1 => Just(r#"{"op":"empty_cache"}"#.to_string()),
        1 => Just(r#"{"op":"reset_peak"}"#.to_string()),
        1 => Just(r#"{"op":"alloc","id":-1,"size":-5}"#.to_string()),
        1 => Just(r#"{"op":"alloc","id":1,"size":1e400}"#.to_string()),
        1 => Just(r#"{"op":"alloc","id":1,"size":99999999999999999999999}"#.to_string()),
        1 => "[ -~]{0,40}",
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        1 => (1usize..40).prop_map(|d| "[".repeat(d * 100)),
    ]
}

/// A safetensors file: a JSON header with hostile shapes and offsets.
fn hostile_safetensors() -> impl Strategy<Value = Vec<u8>> {
    let dim = prop_oneof![
        Just(0u64),
        Just(1),
        3u64..20,
        Just(u32::MAX as u64),
        Just(u64::MAX),
        Just(1u64 << 62),
    ];
    let name = prop_oneof![
        Just("layers.0.weight"),
        Just("layers.1.weight"),
        Just("fc.weight"),
        Just("stem.weight"),
        Just("x"),
        Just("y"),
    ];
    let dtype = prop_oneof![
        Just("F32"),
        Just("F16"),
        Just("I64"),
        Just("BF16"),
        Just("Q4")
    ];
    let entry = (
        name,
        dtype,
        prop::collection::vec(dim, 0..4),
        any::<u16>(),
        any::<u16>(),
    );
    (
        prop::collection::vec(entry, 0..4),
        0usize..512,
        any::<bool>(),
    )
        .prop_map(|(entries, data_len, lie_about_length)| {
            let mut header = serde_json::Map::new();
            for (name, dtype, shape, a, b) in entries {
                header.insert(
                    name.to_string(),
                    serde_json::json!({
                        "dtype": dtype,
                        "shape": shape,
                        "data_offsets": [a.min(b) as u64, a.max(b) as u64],
                    }),
                );
            }
            let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap_or_default();
            let len = if lie_about_length {
                u64::MAX - 3
            } else {
                h.len() as u64
            };
            let mut out = len.to_le_bytes().to_vec();
            out.extend(h);
            out.extend(std::iter::repeat_n(0u8, data_len));
            out
        })
}

/// A snapshot-shaped dict with hostile numbers, pickled.
fn hostile_snapshot() -> impl Strategy<Value = Vec<u8>> {
    let action = prop_oneof![
        Just("alloc"),
        Just("free_requested"),
        Just("free_completed"),
        Just("segment_alloc"),
        Just("segment_free"),
        Just("segment_map"),
        Just("segment_unmap"),
        Just("oom"),
        Just("snapshot"),
    ];
    let entry = (action, 0i64..6, prop_oneof![any::<i64>(), 0i64..(64 << 20)]);
    let block = (
        0i64..6,
        prop_oneof![any::<i64>(), 0i64..(64 << 20)],
        any::<bool>(),
    );
    let segment = (
        0i64..6,
        prop_oneof![any::<i64>(), 0i64..(64 << 20)],
        any::<bool>(),
        prop::collection::vec(block, 0..4),
    );
    (
        prop::collection::vec(entry, 1..30),
        prop::collection::vec(segment, 0..4),
        any::<bool>(),
    )
        .prop_map(|(trace, segments, expandable)| {
            let s = PyValue::str;
            // An alloc over a block still live is refused as corrupt: such
            // allocs take an address of their own, so most traces replay.
            let mut live = std::collections::HashSet::new();
            let trace: Vec<PyValue> = trace
                .into_iter()
                .enumerate()
                .map(|(i, (a, addr, size))| {
                    let addr = match a {
                        "alloc" if !live.insert(addr) => {
                            live.insert(64 + i as i64);
                            64 + i as i64
                        }
                        "free_completed" => {
                            live.remove(&addr);
                            addr
                        }
                        _ => addr,
                    };
                    PyValue::dict(vec![
                        (s("action"), s(a)),
                        (s("addr"), PyValue::Int(addr << 21)),
                        (s("size"), PyValue::Int(size)),
                        (s("device_free"), PyValue::Int(size)),
                    ])
                })
                .collect();
            let segments: Vec<PyValue> = segments
                .into_iter()
                .map(|(addr, size, large, blocks)| {
                    PyValue::dict(vec![
                        (s("device"), PyValue::Int(0)),
                        (s("address"), PyValue::Int(addr << 21)),
                        (s("total_size"), PyValue::Int(size)),
                        (s("allocated_size"), PyValue::Int(size / 2)),
                        (s("segment_type"), s(if large { "large" } else { "small" })),
                        (s("is_expandable"), PyValue::Bool(expandable)),
                        (
                            s("blocks"),
                            PyValue::list(
                                blocks
                                    .into_iter()
                                    .map(|(a, size, live)| {
                                        PyValue::dict(vec![
                                            (s("address"), PyValue::Int((addr << 21) + (a << 9))),
                                            (s("size"), PyValue::Int(size)),
                                            (s("requested_size"), PyValue::Int(size)),
                                            (
                                                s("state"),
                                                s(if live {
                                                    "active_allocated"
                                                } else {
                                                    "inactive"
                                                }),
                                            ),
                                        ])
                                    })
                                    .collect(),
                            ),
                        ),
                    ])
                })
                .collect();
            pickle(&PyValue::dict(vec![
                (s("segments"), PyValue::list(segments)),
                (
                    s("device_traces"),
                    PyValue::list(vec![PyValue::list(trace)]),
                ),
                (
                    s("allocator_settings"),
                    PyValue::dict(vec![(s("expandable_segments"), PyValue::Bool(expandable))]),
                ),
            ]))
        })
}

fn hostile_option() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        prop::sample::select(vec![
            "max_split_size_mb",
            "roundup_power2_divisions",
            "garbage_collection_threshold",
            "expandable_segments",
            "lookahead",
            "small_from_large",
            "release_before_grow",
        ])
        .prop_map(String::from),
        "[a-z_]{0,12}",
    ];
    let value = prop_oneof![
        Just("NaN".to_string()),
        Just("inf".to_string()),
        Just("-1".to_string()),
        Just("18446744073709551615".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("[1:2,>:4]".to_string()),
        Just("[:,:]".to_string()),
        Just("[".to_string()),
        Just("True".to_string()),
        "[ -~]{0,10}",
        any::<u64>().prop_map(|v| v.to_string()),
    ];
    prop::collection::vec((key, value), 0..5).prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(200), ..ProptestConfig::default() })]

    /// Traces: the plain replay and the strategy comparison read the same
    /// lines with the same checks; neither panics, and every error names
    /// the line.
    #[test]
    fn traces_never_panic(lines in prop::collection::vec(hostile_line(), 0..40), expandable in any::<bool>()) {
        let text = lines.join("\n");
        let conf = if expandable { "expandable_segments:True" } else { "" };
        let mut a = CachingAllocator::new(
            SimulatedSource::new(1 << 30),
            AllocatorConfig::parse(conf).unwrap(),
        );
        let out = replay(&mut a, Cursor::new(text.as_bytes()), true);
        if let Some(e) = &out.error {
            prop_assert!(e.line >= 1 && !e.message.is_empty());
        }
        a.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(a.memory_reserved() <= 1 << 30);
        match Workload::from_trace("t", Cursor::new(text.as_bytes())) {
            Ok(w) => {
                // The same checks as the replay: a trace it accepts, the
                // replay accepted too.
                prop_assert!(out.error.is_none(), "{:?}", out.error);
                let names = vramlab::lab::strategies::NAMES;
                let r = vramlab::lab::workload::compare(&w, &names, Some(1 << 30));
                prop_assert!(r.is_ok());
            }
            Err(e) => prop_assert!(e.to_string().starts_with("line "), "{e}"),
        }
    }

    /// Snapshot pickles with hostile numbers and structure: read and
    /// replayed (every device) without a panic.
    #[test]
    fn snapshots_never_panic(bytes in hostile_snapshot()) {
        if let Ok(file) = torch_snapshot::read_all(&bytes, "fuzz") {
            for snap in &file.devices {
                let mut config = file.settings.clone().unwrap_or_default();
                config.expandable_segments |= snap.expandable;
                let _ = torch_snapshot::replay_from_state(snap, config, Some(1 << 34));
            }
        }
    }

    /// Byte-level damage to a real snapshot: flips and truncations.
    #[test]
    fn damaged_real_snapshots_never_panic(at in 0usize..20_000, flip in any::<u8>(), cut in any::<bool>()) {
        let mut bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshots/scenario.pickle")).unwrap();
        let at = at % bytes.len();
        if cut {
            bytes.truncate(at);
        } else {
            bytes[at] ^= flip | 1;
        }
        if unpickle(&bytes).is_ok() {
            if let Ok(file) = torch_snapshot::read_all(&bytes, "fuzz") {
                for snap in &file.devices {
                    let _ = torch_snapshot::replay_from_state(snap, AllocatorConfig::default(), None);
                }
            }
        }
    }

    /// Safetensors with 0-dimensional weights, overflowing shapes, lying
    /// lengths and offsets: parsed, and model sizes read from them, with
    /// errors that name what is wrong.
    #[test]
    fn safetensors_never_panic(bytes in hostile_safetensors()) {
        if let Ok(st) = SafeTensors::parse(&bytes, "fuzz.safetensors") {
            for name in ["mlp", "simple-cnn", "resnet-mini", "attention"] {
                let mut spec = vramlab::nn::ModelSpec::default_for(name).unwrap();
                if let Err(e) = spec.adapt_to_weights(&st) {
                    prop_assert!(!e.to_string().is_empty());
                }
            }
            for name in st.tensors.keys() {
                let _ = st.f32(name);
                let _ = st.i64(name);
            }
        }
    }

    /// Allocator options: any string is parsed or refused by name, and what
    /// parses runs a short trace cleanly.
    #[test]
    fn allocator_options_never_panic(conf in hostile_option()) {
        match AllocatorConfig::parse(&conf) {
            Ok(c) => {
                let mut a = CachingAllocator::new(SimulatedSource::new(1 << 30), c);
                let mut live = Vec::new();
                for size in [1u64, 3 << 20, 25 << 20, 512, 700 << 20, 1 << 29] {
                    if let Ok(x) = a.malloc(size, "t") {
                        live.push(x.handle);
                    }
                }
                a.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
                for h in live {
                    a.free(h).unwrap();
                }
                a.empty_cache();
                prop_assert_eq!(a.memory_reserved(), 0);
            }
            Err(e) => prop_assert!(e.to_string().contains("allocator config")),
        }
    }
}

/// Runs the binary under a 2 GiB address-space limit and a 60 s time limit (debug builds are slow);
/// returns (exit code, stderr). A signal is reported as code -1.
fn run_limited(args: &[String]) -> (i32, String) {
    let (code, _, err) = run_limited_out(args);
    (code, err)
}

/// `run_limited`, with stdout too: (exit code, stdout, stderr).
fn run_limited_out(args: &[String]) -> (i32, String, String) {
    let bin = env!("CARGO_BIN_EXE_vramlab");
    let quoted: Vec<String> = args
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    let script = format!(
        "ulimit -v 2097152; exec timeout -s KILL 60 '{bin}' {}",
        quoted.join(" ")
    );
    let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
    (out.status.code().unwrap_or(-1), stdout(&out), stderr(&out))
}

fn hostile_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("NaN".to_string()),
        Just("inf".to_string()),
        Just("1e400".to_string()),
        Just("18446744073709551615".to_string()),
        Just("18446744073709551616".to_string()),
        Just("4611686018427387904".to_string()),
        Just("100000000".to_string()),
        Just("500000".to_string()),
        Just("3".to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        "[ -~]{0,8}",
    ]
}

fn hostile_command() -> impl Strategy<Value = Vec<String>> {
    let n = hostile_number;
    prop_oneof![
        (n(), n()).prop_map(|(b, s)| vec![
            "estimate".into(),
            "--model".into(),
            "simple-cnn".into(),
            "--batch".into(),
            b,
            "--steps".into(),
            s
        ]),
        (n(), n(), n()).prop_map(|(a, b, c)| vec![
            "estimate".into(),
            "--model".into(),
            "mlp".into(),
            "--widths".into(),
            format!("{a},{b},{c}")
        ]),
        (n(), n()).prop_map(|(w, d)| vec![
            "estimate".into(),
            "--model".into(),
            "resnet-mini".into(),
            "--width".into(),
            w,
            "--depth".into(),
            d
        ]),
        (n(), n()).prop_map(|(s, b)| vec![
            "estimate".into(),
            "--model".into(),
            "attention".into(),
            "--seq-len".into(),
            s,
            "--batch".into(),
            b
        ]),
        (n(), n()).prop_map(|(f, c)| vec![
            "estimate".into(),
            "--model".into(),
            "mlp".into(),
            "--memory-fraction".into(),
            f,
            "--capacity".into(),
            format!("{c}GiB")
        ]),
        n().prop_map(|l| vec![
            "estimate".into(),
            "--model".into(),
            "mlp".into(),
            "--memory-limit".into(),
            l
        ]),
        (n(), n()).prop_map(|(a, b)| vec![
            "sweep".into(),
            "--model".into(),
            "simple-cnn".into(),
            "--batch".into(),
            format!("{a},{b}")
        ]),
        n().prop_map(|lr| vec![
            "demo".into(),
            "--lr".into(),
            lr,
            "--steps".into(),
            "0".into()
        ]),
        n().prop_map(|lr| vec![
            "train".into(),
            "--lr".into(),
            lr,
            "--batch".into(),
            "0".into()
        ]),
        hostile_option().prop_map(|c| vec![
            "estimate".into(),
            "--model".into(),
            "mlp".into(),
            "--alloc-conf".into(),
            c
        ]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(32), ..ProptestConfig::default() })]

    /// Numeric flags, as a user (or an attacker) types them: exit 0, 1 or
    /// 2, never a panic, a signal or an allocation abort.
    #[test]
    fn numeric_flags_end_cleanly(args in hostile_command()) {
        let (code, err) = run_limited(&args);
        prop_assert!(
            (0..=2).contains(&code) && !err.contains("panicked") && !err.contains("memory allocation"),
            "{args:?}: exit {code}\n{err}"
        );
        if code != 0 {
            prop_assert!(err.contains("error"), "{args:?}: no error message\n{err}");
        }
    }

    /// The same commands under `--json`: stdout is one JSON document
    /// whatever happens; a failure is an object that carries stderr's
    /// message and the exit code, so a program never parses an empty stdout.
    #[test]
    fn json_commands_answer_json_even_when_they_fail(mut args in hostile_command()) {
        args.push("--json".into());
        let (code, out, err) = run_limited_out(&args);
        prop_assert!((0..=2).contains(&code), "{args:?}: exit {code}\n{err}");
        let help = args.iter().any(|a| ["-h", "--help", "-V", "--version"].contains(&a.as_str()));
        if help && code == 0 {
            return Ok(());
        }
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| TestCaseError::fail(format!("{args:?}: exit {code}, stdout is not JSON ({e}):\n{out}\nstderr:\n{err}")))?;
        if code != 0 {
            let message = v["error"].as_str().unwrap_or_default();
            prop_assert!(!message.is_empty(), "{args:?}: no error in {v}");
            prop_assert_eq!(v["exit_code"].as_i64(), Some(code as i64));
            // stderr says the same thing for a person.
            let first = message.lines().next().unwrap_or_default();
            prop_assert!(err.contains(first), "{args:?}: stderr lacks {first:?}\n{err}");
            prop_assert!(v["causes"].as_array().is_some_and(|c| !c.is_empty()));
        }
    }
}

/// Files nobody should feed vramlab, fed to `replay`: each ends with a
/// clear error (exit 1) within the limits.
#[test]
fn replay_refuses_junk_files_by_name() {
    let dir = std::env::temp_dir().join(format!("vramlab-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let deep = format!("\u{80}\u{2}{}", "(".repeat(200_000));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("zeros.jsonl", vec![0u8; 300_000]),
        ("deep.pickle", {
            let mut v = vec![0x80, 0x02];
            v.extend(std::iter::repeat_n(b']', 200_000));
            v
        }),
        ("deep_marks.pickle", deep.into_bytes()),
        ("huge.jsonl", br#"{"op":"alloc","id":1,"size":18446744073709551615}"#.to_vec()),
        ("double_free.jsonl", b"{\"op\":\"alloc\",\"id\":1,\"size\":5}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"free\",\"id\":1}\n".to_vec()),
        ("empty.jsonl", Vec::new()),
    ];
    for (name, bytes) in cases {
        let p = dir.join(name);
        std::fs::write(&p, &bytes).unwrap();
        for extra in [
            &[][..],
            &["--allocators".to_string(), "pytorch,planner".to_string()][..],
        ] {
            let mut args = vec!["replay".to_string(), p.display().to_string()];
            args.extend_from_slice(extra);
            let (code, err) = run_limited(&args);
            assert!(
                (0..=1).contains(&code) && !err.contains("panicked"),
                "{name} {extra:?}: exit {code}\n{err}"
            );
            if name != "empty.jsonl" {
                assert_eq!(code, 1, "{name} {extra:?}: {err}");
                assert!(err.contains("error"), "{name}: {err}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
