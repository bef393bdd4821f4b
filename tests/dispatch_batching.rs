//! The host's recording of dispatches: untimed dispatches share one compute
//! pass and one uniform arena per submit. Each dispatch must still read its
//! own parameters across submits, arena refills, passes ended by copies,
//! timed stretches (a pass each, with waits) and windowed bindings.

use crate::common;
use common::*;
use vramlab::device::AdapterOptions;
use vramlab::memory::AllocatorConfig;
use vramlab::ops::{elementwise, fill};
use vramlab::tensor::{Engine, Tensor};

/// `n` fills, each of its own tensor with its own value, then checks them
/// all: an offset reused or written late would show as a wrong value.
fn fills(e: &Engine, n: usize, len: usize, what: &str) {
    let ts: Vec<Tensor> = (0..n)
        .map(|_| Tensor::empty(e, &[len], vramlab::tensor::DType::F32, "t").unwrap())
        .collect();
    for (i, t) in ts.iter().enumerate() {
        fill::fill(t, i as f32 + 0.5).unwrap();
    }
    for (i, t) in ts.iter().enumerate() {
        let v = t.to_vec().unwrap();
        assert!(
            v.iter().all(|x| *x == i as f32 + 0.5),
            "{what}: tensor {i} holds {:?}",
            &v[..v.len().min(4)]
        );
    }
}

#[test]
fn every_dispatch_reads_its_own_parameters() {
    let e = engine();
    // Past several submits (256 commands each) and arena refills.
    fills(&e, 1500, 3, "1500 untimed fills");
    // Uploads between dispatches end the shared pass; the values must
    // still flow through in order.
    let mut rng = Rng::new(9);
    let mut acc = Tensor::from_slice(&e, &[0.0; 7], &[7], "acc").unwrap();
    let mut want = vec![0.0f64; 7];
    for _ in 0..300 {
        let x = rng.vec(7);
        let t = Tensor::from_slice(&e, &x, &[7], "x").unwrap();
        acc = elementwise::add(&acc, &t).unwrap();
        want.iter_mut().zip(&x).for_each(|(w, v)| *w += *v as f64);
    }
    let err = max_rel_err(&acc.to_vec().unwrap(), &want);
    assert!(err < 1e-5, "uploads between dispatches: {err}");
}

#[test]
fn arenas_reused_after_waits_keep_each_dispatchs_parameters() {
    // A step's first submits come early (8, 16, 32, … commands after a
    // wait), and arenas are rewritten once a wait saw their submits end:
    // runs of fills with and without waits between them must each keep
    // their own values.
    let e = engine();
    let mut all = Vec::new();
    for round in 0..8 {
        for i in 0..(20 + 37 * round) {
            let t = Tensor::empty(&e, &[3], vramlab::tensor::DType::F32, "t").unwrap();
            let v = (round * 1000 + i) as f32;
            fill::fill(&t, v).unwrap();
            all.push((t, v));
        }
        if round % 3 != 2 {
            e.synchronize().unwrap();
        }
    }
    for (k, (t, v)) in all.iter().enumerate() {
        let got = t.to_vec().unwrap();
        assert!(got.iter().all(|x| x == v), "fill {k}: {got:?}, want {v}");
    }
}

#[test]
fn timed_dispatches_past_a_full_query_set_keep_their_parameters() {
    // 2,048 query pairs: the 2,049th timed dispatch waits for the set to
    // be read back, and its uniforms are staged after that wait.
    let e = engine();
    e.start_timing();
    fills(&e, 2100, 2, "2100 timed fills");
    let (_, times) = e.take_dispatch_times().unwrap().expect("timing is on");
    assert!(times.len() >= 2100, "{} times", times.len());
    e.stop_timing().unwrap();
}

#[test]
fn timed_and_untimed_stretches_interleave() {
    let e = engine();
    for round in 0..3 {
        e.start_timing();
        fills(&e, 40, 5, &format!("round {round}, timed"));
        e.stop_timing().unwrap();
        fills(&e, 300, 5, &format!("round {round}, untimed"));
    }
}

#[test]
fn windowed_dispatches_read_their_own_tables() {
    // 1 KiB windows: each 4 KiB tensor spans four, so every dispatch stages
    // a window table beside its parameters.
    let small = AdapterOptions {
        binding_limit: Some(1024),
        ..adapter_options()
    };
    let e = engine_from(&small, AllocatorConfig::default());
    fills(&e, 400, 1024, "windowed fills");
    // Products bind their operands whole, in windows: a table each.
    let mut rng = Rng::new(4);
    let (m, k, n) = (16, 33, 17);
    let cases: Vec<(Vec<f32>, Vec<f32>, Tensor)> = (0..120)
        .map(|_| {
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            let ta = Tensor::from_slice(&e, &a, &[m, k], "a").unwrap();
            let tb = Tensor::from_slice(&e, &b, &[k, n], "b").unwrap();
            let c = vramlab::ops::matmul::matmul(&ta, &tb).unwrap();
            (a, b, c)
        })
        .collect();
    for (i, (a, b, c)) in cases.iter().enumerate() {
        let err = max_rel_err(&c.to_vec().unwrap(), &matmul_ref(a, b, m, k, n));
        assert!(err < 1e-4, "windowed product {i}: {err}");
    }
}
