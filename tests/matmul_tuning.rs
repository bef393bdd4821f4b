//! Tile tuning: the first run times candidates for each shape class and
//! writes the cache file; a second run reads it, times nothing and picks
//! the same tiles; a bad setting is refused with what to set instead; and
//! tuning leaves the measured memory of a step exactly as the estimate;
//! and the kernels of a round of candidates are compiled ahead, together.

use crate::common::cli::{command, stderr};
use crate::common::{self, Rng, RngExt};
use serde_json::Value;
use std::path::Path;
use vramlab::ops::matmul::{gemm, Gemm, MatView, MatmulKernel, TileConfig};
use vramlab::tensor::Tensor;

fn vramlab(cache: &Path, args: &[&str]) -> std::process::Output {
    command(args)
        .env("VRAMLAB_TUNE", "on")
        .env("VRAMLAB_TUNE_CACHE", cache)
        // Each candidate compiles for a second or two on a CPU adapter.
        .env("VRAMLAB_TUNE_CANDIDATES", "3")
        .env("VRAMLAB_TUNE_BUDGET_MS", "60000")
        .env_remove("VRAMLAB_TILE_FAMILY")
        .output()
        .expect("vramlab runs")
}

fn bench(cache: &Path) -> Value {
    let out = vramlab(
        cache,
        &[
            "bench",
            "--sizes",
            "72",
            "--models",
            "none",
            "--reps",
            "1",
            "--no-precision",
            "--json",
        ],
    );
    common::json_of(out)
}

#[test]
fn a_second_run_reads_the_cache_times_nothing_and_picks_the_same_tiles() {
    let dir = std::env::temp_dir().join(format!("vramlab-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("tiles.json");
    let first = bench(&cache)["tuning"].clone();
    assert!(first["tuned"].as_u64().unwrap() >= 1, "{first}");
    assert!(first["timed"].as_u64().unwrap() >= 2, "{first}");
    assert_eq!(first["from_cache"], 0, "{first}");
    // Every timed tile's kernel was compiled ahead, on the probe device.
    assert!(
        first["compiled_ahead"].as_u64().unwrap() >= first["timed"].as_u64().unwrap(),
        "{first}"
    );
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    let adapters = file["adapters"].as_object().unwrap();
    assert_eq!(adapters.len(), 1, "{file}");
    let entries = adapters.values().next().unwrap().as_object().unwrap();
    assert_eq!(
        entries.len() as u64,
        first["tuned"].as_u64().unwrap(),
        "{file}"
    );
    for e in entries.values() {
        assert!(e["gflops"].as_f64().unwrap() > 0.0, "{e}");
        assert!(e["gflops"].as_f64().unwrap() >= e["fixed_gflops"].as_f64().unwrap());
    }

    let second = bench(&cache)["tuning"].clone();
    assert_eq!(second["timed"], 0, "{second}");
    assert_eq!(second["tuned"], 0, "{second}");
    assert_eq!(second["from_cache"], first["tuned"], "{second}");
    assert_eq!(second["compiled_ahead"], 0, "{second}");
    assert_eq!(second["choices"], first["choices"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Under autocast f16, products on tensor cores tune their block layout
/// per shape class as products on the plain kernels tune their tiles: the
/// cache keeps them apart, a second run reads them and times nothing, and
/// the step's measured memory stays equal to the estimate. Without tensor
/// cores (bookworm's lavapipe) no class is a tensor-core one.
#[test]
fn tensor_core_layouts_are_tuned_cached_and_leave_memory_alone() {
    let dir = std::env::temp_dir().join(format!("vramlab-tuning-coop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("tiles.json");
    let args = [
        "bench",
        "--sizes",
        "16",
        "--models",
        "mlp",
        "--batch",
        "3",
        "--amp",
        "f16",
        "--reps",
        "1",
        "--no-precision",
        "--json",
    ];
    let first = common::json_of(vramlab(&cache, &args));
    let cores = first["tensor_cores"].as_bool().unwrap();
    let tuning = &first["tuning"];
    let choices = tuning["choices"].as_object().unwrap();
    let coop: Vec<&String> = choices.keys().filter(|k| k.starts_with("coop ")).collect();
    assert_eq!(!coop.is_empty(), cores, "{tuning}");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    let cached: usize = file["coop"].as_object().map_or(0, |a| {
        a.values().map(|m| m.as_object().unwrap().len()).sum()
    });
    assert_eq!(cached, coop.len(), "{file}");
    for m in file["coop"]
        .as_object()
        .into_iter()
        .flat_map(|a| a.values())
    {
        for e in m.as_object().unwrap().values() {
            assert!(
                e["gflops"].as_f64().unwrap() >= e["fixed_gflops"].as_f64().unwrap(),
                "{e}"
            );
        }
    }
    let second = common::json_of(vramlab(&cache, &args));
    assert_eq!(second["tuning"]["timed"], 0, "{}", second["tuning"]);
    assert_eq!(second["tuning"]["from_cache"], tuning["tuned"]);
    assert_eq!(second["tuning"]["choices"], tuning["choices"]);
    // A fresh cache: the measured step tunes as it runs.
    let fresh = dir.join("fresh.json");
    let v = common::json_of(vramlab(
        &fresh,
        &[
            "estimate",
            "--model",
            "mlp",
            "--batch",
            "3",
            "--amp",
            "f16",
            "--measure",
            "--json",
        ],
    ));
    for key in [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_allocs",
    ] {
        assert_eq!(v["estimate"][key], v["measured"][key], "{key}");
    }
    let tuned = std::fs::read_to_string(&fresh).unwrap_or_default();
    assert_eq!(tuned.contains("\"coop f16"), cores, "{tuned}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_bad_setting_is_refused_with_the_values_it_takes() {
    let out = command(["models"])
        .env("VRAMLAB_TUNE", "fastest")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("VRAMLAB_TUNE") && err.contains("auto, on or off"),
        "{err}"
    );
}

#[test]
fn tuning_leaves_the_measured_step_equal_to_the_estimate() {
    let dir = std::env::temp_dir().join(format!("vramlab-tuning-est-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("tiles.json");
    let out = vramlab(
        &cache,
        &[
            "estimate",
            "--model",
            "mlp",
            "--batch",
            "3",
            "--measure",
            "--json",
        ],
    );
    let v = common::json_of(out);
    let (est, m) = (&v["estimate"], &v["measured"]);
    assert!(m.is_object(), "{v}");
    for key in [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "device_allocs",
    ] {
        assert!(est[key].as_u64().unwrap() > 0, "{key}");
        assert_eq!(est[key], m[key], "{key}");
    }
    // Tuning did happen (the cache file holds the step's classes).
    let file = std::fs::read_to_string(&cache).unwrap();
    assert!(file.contains("gflops"), "{file}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kernels_collected_ahead_run_nothing_and_compile_once_several_at_a_time() {
    // What the tuner does with each round of candidates: learn the kernels
    // a product runs without running it, compile them on several threads,
    // then run it, compiling nothing more.
    let e = common::engine();
    let gpu = e.gpu().expect("a GPU engine");
    let mut rng = Rng::new(5);
    let (m, n, k) = (37, 45, 300);
    let (a, b) = (rng.vec(m * k), rng.vec(k * n));
    let ta = Tensor::from_slice(&e, &a, &[m, k], "a").unwrap();
    let tb = Tensor::from_slice(&e, &b, &[k, n], "b").unwrap();
    let tc = Tensor::from_slice(&e, &vec![f32::NAN; m * n], &[m, n], "c").unwrap();
    let g = Gemm {
        m,
        n,
        k,
        batch: 1,
        a: MatView::dense(0, m, k, false),
        b: MatView::dense(0, k, n, false),
        c_offset: 0,
        c_batch_stride: m * n,
        accumulate: false,
        reduce_batch: false,
        implicit_b: None,
    };
    // Two tiles of the GPU family and one direct, none compiled yet.
    let tiles = [
        TileConfig::new(8, 8, 4, 4, 16, true),
        TileConfig::new(16, 8, 8, 4, 16, true),
        TileConfig::new(8, 4, 3, 5, 16, false),
    ];
    let before = gpu.pipelines_compiled();
    let mut kernels = Vec::new();
    for t in tiles {
        let (r, ks) = gpu.kernels_of(|| gemm(&g, &ta, &tb, &tc, MatmulKernel::Fixed(t)));
        r.unwrap();
        assert!(ks.iter().any(|k| k.name.starts_with("matmul[")), "{ks:?}");
        kernels.extend(ks);
    }
    assert_eq!(
        gpu.pipelines_compiled(),
        before,
        "collecting compiles nothing"
    );
    assert!(
        tc.to_vec().unwrap().iter().all(|v| v.is_nan()),
        "collecting ran a kernel"
    );
    let compiled = gpu.precompile(&kernels, 3);
    assert!(compiled >= tiles.len(), "{compiled}");
    assert_eq!(gpu.pipelines_compiled(), before + compiled);
    assert_eq!(gpu.precompile(&kernels, 3), 0, "compiled once");
    for t in tiles {
        gemm(&g, &ta, &tb, &tc, MatmulKernel::Fixed(t)).unwrap();
        let got = tc.to_vec().unwrap();
        let want = common::matmul_ref(&a, &b, m, k, n);
        let err = common::max_rel_err(&got, &want);
        assert!(err < 1e-4, "{}: rel err {err}", t.describe());
    }
    assert_eq!(
        gpu.pipelines_compiled(),
        before + compiled,
        "running compiled nothing more"
    );
}

#[test]
fn a_failed_compile_ahead_keeps_nothing_and_a_panic_stops_collecting() {
    // A round with a kernel that does not compile: none of its kernels is
    // kept (the errors cannot be told apart), and each compiles at its own
    // dispatch later. A panic inside kernels_of leaves dispatches running.
    use vramlab::device::Kernel;
    let e = common::engine();
    let gpu = e.gpu().expect("a GPU engine");
    let before = gpu.pipelines_compiled();
    let bad = Kernel::fixed(
        "tune-test-bad",
        "@compute @workgroup_size(1) fn main( {",
        "main",
    );
    let good = Kernel::fixed(
        "tune-test-good",
        "@compute @workgroup_size(1) fn main() {}",
        "main",
    );
    assert_eq!(gpu.precompile(&[bad, good.clone()], 2), 0);
    assert_eq!(gpu.pipelines_compiled(), before, "nothing kept");
    e.synchronize().expect("the dropped errors do not linger");
    assert_eq!(gpu.precompile(&[good], 2), 1);

    let x = Tensor::from_slice(&e, &[1.0, 2.0, 3.0, 4.0], &[2, 2], "x").unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gpu.kernels_of(|| {
            vramlab::ops::matmul::matmul(&x, &x).unwrap();
            panic!("inside the collection");
        })
    }));
    assert!(caught.is_err());
    let y = vramlab::ops::matmul::matmul(&x, &x).unwrap();
    assert_eq!(
        y.to_vec().unwrap(),
        vec![7.0, 10.0, 15.0, 22.0],
        "the product ran"
    );
}
