//! Tensors bound in windows (device::windows) compute exactly what tensors
//! bound whole compute: the same training steps on an engine whose
//! bindings are forced down to a few KiB give the same losses and the same
//! parameters, bit for bit, and the same memory, for every zoo model and
//! precision. The kernels' arithmetic does not change with windows (only
//! where each element is read from), so anything short of bit equality is
//! a window read or written wrong. The same holds with buffers forced down
//! to a few KiB, so every segment is backed by many buffers and tensors
//! cross from one into the next (device::segment_buffers).

use crate::common;

use vramlab::device::DeviceError;
use vramlab::estimate::Plan;
use vramlab::memory::AllocatorConfig;
use vramlab::nn::gpt::GptConfig;
use vramlab::nn::ModelSpec;
use vramlab::tensor::{DType, Engine, TensorError};
use vramlab::train::{Mode, OptimizerConfig, OptimizerKind};

struct Outcome {
    losses: Vec<u32>,
    params: Vec<(String, Vec<u32>)>,
    peak_allocated: u64,
    windowed_dispatches: u64,
}

/// A binding window or a buffer size forced small.
#[derive(Clone, Copy, Debug)]
enum Limit {
    Whole,
    Window(u64),
    Buffer(u64),
}

fn engine(limit: Limit) -> Engine {
    let mut options = common::adapter_options();
    match limit {
        Limit::Whole => {}
        Limit::Window(w) => options.binding_limit = Some(w),
        Limit::Buffer(b) => options.buffer_limit = Some(b),
    }
    common::engine_from(&options, AllocatorConfig::default())
}

fn run(plan: &Plan, limit: Limit, steps: usize) -> Result<Outcome, TensorError> {
    let e = engine(limit);
    let (mut trainer, batch) = plan.trainer(&e, 7)?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        losses.push(trainer.step(&batch)?.loss.to_bits());
    }
    let mut params = Vec::new();
    for p in trainer.store.iter() {
        let v = p.value.to_vec()?;
        params.push((p.name.clone(), v.iter().map(|x| x.to_bits()).collect()));
    }
    let peak_allocated = e.allocator().max_memory_allocated();
    Ok(Outcome {
        losses,
        params,
        peak_allocated,
        windowed_dispatches: e.gpu().unwrap().windowed_dispatches(),
    })
}

/// The plan's largest parameter, in bytes.
fn largest_parameter(plan: &Plan) -> u64 {
    plan.model
        .parameter_shapes()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64 * 4)
        .max()
        .unwrap()
}

/// Runs `plan` whole and in windows, and checks they agree bit for bit.
/// The window starts at a third of the largest parameter (so it spans
/// three, and the optimizer's four tensors of it fit the device's
/// bindings; larger activations span more) and doubles while some
/// dispatch needs more bindings than the device has.
fn check(plan: &Plan) {
    let whole = run(plan, Limit::Whole, 2).unwrap();
    assert_eq!(whole.windowed_dispatches, 0);
    let start = (largest_parameter(plan) / 3).next_power_of_two().max(256);
    compare(plan, &whole, Limit::Window, start);
    compare(plan, &whole, Limit::Buffer, start);
}

/// Runs `plan` with `limit(size)`, doubling `size` while some dispatch
/// needs more bindings than the device has, and checks it agrees with
/// `whole` bit for bit.
fn compare(plan: &Plan, whole: &Outcome, limit: fn(u64) -> Limit, mut size: u64) {
    let windowed = loop {
        match run(plan, limit(size), 2) {
            Ok(o) => break o,
            Err(TensorError::Device(DeviceError::TooManyWindows { .. })) => size *= 2,
            Err(e) => panic!("{}: {e}", plan.model.describe()),
        }
    };
    let what = format!("{} with {:?}", plan.model.describe(), limit(size));
    assert!(
        largest_parameter(plan) > size && windowed.windowed_dispatches > 0,
        "{what}: nothing was windowed"
    );
    assert_eq!(whole.losses, windowed.losses, "{what}: losses differ");
    assert_eq!(whole.peak_allocated, windowed.peak_allocated, "{what}");
    for ((name, a), (_, b)) in whole.params.iter().zip(&windowed.params) {
        let differ = a.iter().zip(b).filter(|(x, y)| x != y).count();
        assert_eq!(differ, 0, "{what}: {name} differs in {differ} elements");
    }
    eprintln!(
        "{what}: {} windowed dispatches, losses {:?}",
        windowed.windowed_dispatches,
        windowed
            .losses
            .iter()
            .map(|b| f32::from_bits(*b))
            .collect::<Vec<_>>()
    );
}

fn plan(model: ModelSpec, batch: usize, amp: Option<DType>, kind: OptimizerKind) -> Plan {
    Plan {
        model,
        batch,
        optimizer: OptimizerConfig::new(kind, None, Some(0.9), None),
        mode: Mode::Train,
        amp,
        dtype: DType::F32,
        loss: Default::default(),
        config: AllocatorConfig::default(),
    }
}

fn models() -> Vec<(ModelSpec, usize)> {
    vec![
        (
            ModelSpec::from(vramlab::nn::MlpSpec {
                widths: vec![203, 97, 61, 10],
                checkpoint_every: 0,
            }),
            13,
        ),
        (
            ModelSpec::from(vramlab::nn::ResnetMiniSpec {
                width: 8,
                depth: 2,
                resolution: 14,
                classes: 5,
            }),
            3,
        ),
        (
            ModelSpec::from(vramlab::nn::AttentionSpec {
                seq_len: 13,
                dim: 20,
                hidden: 37,
                classes: 4,
            }),
            5,
        ),
        (
            ModelSpec::from(vramlab::nn::GptSpec {
                config: GptConfig {
                    layers: 2,
                    heads: 2,
                    dim: 24,
                    seq_len: 11,
                    vocab: 59,
                },
                seq: 11,
                dropout: 0.1,
            }),
            3,
        ),
    ]
}

#[test]
fn every_model_trains_the_same_in_windows_f32() {
    for (m, batch) in models() {
        check(&plan(m, batch, None, OptimizerKind::Adamw));
    }
}

#[test]
fn every_model_trains_the_same_in_windows_under_autocast() {
    // resnet-mini in f16 (with GradScaler), gpt in bf16.
    for (i, (m, batch)) in models().into_iter().enumerate().skip(1).step_by(2) {
        let amp = if i == 1 { DType::F16 } else { DType::Bf16 };
        check(&plan(m, batch, Some(amp), OptimizerKind::Sgd));
    }
}

#[test]
fn the_documents_convnet_trains_the_same_in_windows() {
    // SimpleConvNet: conv outputs and the 100,352-wide fc span windows.
    check(&plan(
        ModelSpec::from(vramlab::nn::SimpleCnnSpec),
        2,
        None,
        OptimizerKind::Sgd,
    ));
}

#[test]
fn a_dispatch_that_cannot_be_cut_past_the_binding_budget_says_so() {
    // A channel sum reads all of its input in one dispatch: 300 KB in
    // 256 B windows is over a thousand bindings.
    let e = engine(Limit::Window(256));
    let err = vramlab::ops::fill::full(&e, &[3, 2, 12_500], 1.0, "big")
        .and_then(|t| vramlab::ops::bias::sum_channels(&t, 2, 12_500, "sum"))
        .and_then(|t| t.to_vec().map(|_| ()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("max_storage_buffers_per_shader_stage") && err.contains("channel_sum"),
        "{err}"
    );
}

/// The bits of every flat kernel's outputs on `e`: fills, the binary ops,
/// accumulation, ReLU (pairs and vec4), GELU and its backward, casts to
/// and from 16-bit types, AdamW and SGD steps, and the row kernels.
fn flat_outputs(e: &Engine) -> Vec<(String, Vec<u32>)> {
    use common::{Rng, RngExt};
    use vramlab::nn::ParamStore;
    use vramlab::ops::{cast, elementwise, fill, gelu, relu};
    use vramlab::optim::{Adam, Optimizer, Sgd};
    use vramlab::tensor::Tensor;
    let mut rng = Rng::new(41);
    let mut out = Vec::new();
    let mut keep = |name: &str, t: &Tensor| {
        let bits = t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect();
        out.push((name.to_string(), bits));
    };
    for n in [30_011usize, 30_012] {
        let x = Tensor::from_slice(e, &rng.vec(n), &[n], "x").unwrap();
        let y = Tensor::from_slice(e, &rng.vec(n), &[n], "y").unwrap();
        keep("full", &fill::full(e, &[n], 0.25, "full").unwrap());
        keep(
            "zeros f16",
            &fill::zeros_as(e, &[n], DType::F16, "z").unwrap(),
        );
        keep("add", &elementwise::add(&x, &y).unwrap());
        keep("sub", &elementwise::sub(&x, &y).unwrap());
        keep("mul", &elementwise::mul(&x, &y).unwrap());
        let acc = elementwise::add(&x, &y).unwrap();
        keep(
            "accumulate",
            &elementwise::accumulate(Some(acc), x.clone()).unwrap(),
        );
        let r = relu::relu(&x).unwrap();
        keep("relu", &r);
        keep("relu backward", &relu::relu_backward(&r, &y).unwrap());
        keep("gelu", &gelu::gelu(&x).unwrap());
        keep("gelu backward", &gelu::gelu_backward(&x, &y).unwrap());
        for d in [DType::F16, DType::Bf16] {
            let h = cast::cast(&x, d, "h").unwrap();
            keep(&format!("cast {d}"), &h);
            keep(
                &format!("cast {d} back"),
                &cast::cast(&h, DType::F32, "back").unwrap(),
            );
            keep(&format!("{d} add"), &elementwise::add(&h, &h).unwrap());
        }
        let mut store = ParamStore::new();
        for name in ["w", "v"] {
            let id = store.add(name, x.clone());
            store.get_mut(id).grad = Some(y.clone());
        }
        let mut adam = Adam::adamw(1e-3);
        let mut store_sgd = ParamStore::new();
        let id = store_sgd.add("s", elementwise::add(&x, &x).unwrap());
        store_sgd.get_mut(id).grad = Some(y.clone());
        let mut sgd = Sgd::new(0.1, 0.9);
        for _ in 0..2 {
            adam.step(&mut store).unwrap();
            sgd.step(&mut store_sgd).unwrap();
        }
        for p in store.iter().chain(store_sgd.iter()) {
            keep(&format!("step {}", p.name), &p.value);
        }
    }
    // Row kernels: softmax (plain, causal, backward), layer norm, the
    // cross-entropy forward. Rows of 32 floats and
    // matrices of 8 × 8: a range starts on the device's offset unit (32 B
    // on lavapipe) in every tensor, layer norm's 4 B a row included, so
    // ranges are 8 rows or more; wider rows would not fit 256 B windows.
    use vramlab::ops::{cross_entropy, layernorm, softmax};
    let (rows, cols) = (200, 32);
    let x = Tensor::from_slice(e, &rng.vec(rows * cols), &[rows, cols], "x").unwrap();
    let g = Tensor::from_slice(e, &rng.vec(rows * cols), &[rows, cols], "g").unwrap();
    let y = softmax::softmax(&x, 0.7).unwrap();
    keep("softmax", &y);
    keep(
        "softmax backward",
        &softmax::softmax_backward(&y, &g, 0.7).unwrap(),
    );
    let s = Tensor::from_slice(e, &rng.vec(30 * 8 * 8), &[30, 8, 8], "s").unwrap();
    keep("causal softmax", &softmax::softmax_causal(&s, 0.5).unwrap());
    let w = Tensor::from_slice(e, &rng.vec(cols), &[cols], "w").unwrap();
    let b = Tensor::from_slice(e, &rng.vec(cols), &[cols], "b").unwrap();
    let ln = layernorm::layernorm(&x, &w, &b, 1e-5).unwrap();
    keep("layernorm", &ln.y);
    let labels: Vec<f32> = (0..rows).map(|r| ((r * 7) % cols) as f32).collect();
    let labels = Tensor::from_slice(e, &labels, &[rows], "labels").unwrap();
    keep(
        "cross-entropy",
        &cross_entropy::cross_entropy(&x, &labels).unwrap(),
    );
    out
}

#[test]
fn flat_kernels_past_the_binding_budget_run_in_ranges_bit_for_bit() {
    // 256 B windows, then 256 B buffers: a 30,011-element f32 tensor spans
    // 469 of them, and one dispatch binds at most 32 (lavapipe) to 48; a
    // row kernel's ranges are whole rows, a causal softmax's whole
    // matrices.
    let whole = flat_outputs(&engine(Limit::Whole));
    for limit in [Limit::Window(256), Limit::Buffer(256)] {
        let e = engine(limit);
        let parts = flat_outputs(&e);
        assert!(e.gpu().unwrap().windowed_dispatches() > 0);
        assert_eq!(whole.len(), parts.len());
        for ((name, a), (_, b)) in whole.iter().zip(&parts) {
            let differ = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(
                differ,
                0,
                "{limit:?}: {name} differs in {differ} of {} elements",
                a.len()
            );
        }
    }
}

/// Layer norm's input gradient runs in ranges of rows past the budget;
/// its parameter gradients (a sum over rows) bind everything at once, so
/// the window is one where only the former is past the budget: 2,560 B,
/// a tenth of x (input gradient: 3 × 10 + 3 windows; parameters: 24).
#[test]
fn layernorm_backward_past_the_binding_budget_bit_for_bit() {
    use common::{Rng, RngExt};
    use vramlab::ops::layernorm;
    use vramlab::tensor::Tensor;
    let run = |e: &Engine| {
        let mut rng = Rng::new(43);
        let (rows, cols) = (200, 32);
        let x = Tensor::from_slice(e, &rng.vec(rows * cols), &[rows, cols], "x").unwrap();
        let g = Tensor::from_slice(e, &rng.vec(rows * cols), &[rows, cols], "g").unwrap();
        let w = Tensor::from_slice(e, &rng.vec(cols), &[cols], "w").unwrap();
        let b = Tensor::from_slice(e, &rng.vec(cols), &[cols], "b").unwrap();
        let ln = layernorm::layernorm(&x, &w, &b, 1e-5).unwrap();
        let (dx, dw, db) = layernorm::layernorm_backward(&x, &w, &ln.mean, &ln.rstd, &g).unwrap();
        [dx, dw, db].map(|t| {
            t.to_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        })
    };
    let parts = engine(Limit::Window(2560));
    assert_eq!(run(&engine(Limit::Whole)), run(&parts));
    assert!(parts.gpu().unwrap().windowed_dispatches() > 0);
}

/// Products whose operands together span far more windows than one
/// dispatch binds, cut into parts (ops::matmul::budget): plain, both transposes,
/// batched, and a long K summed in slices, against f64.
#[test]
fn products_past_the_binding_budget_match_f64() {
    use common::{matmul_ref, max_rel_err, transpose, Rng, RngExt};
    use vramlab::ops::matmul;
    use vramlab::tensor::Tensor;
    let e = engine(Limit::Window(1024));
    let budget = e.gpu().unwrap().limits.max_storage_buffers_per_shader_stage as usize;
    let mut rng = Rng::new(35);
    for &(batch, m, k, n) in &[(1, 40, 301, 29), (3, 37, 45, 43), (1, 2, 3_001, 3)] {
        let (a, b) = (rng.vec(batch * m * k), rng.vec(batch * k * n));
        let windows = (a.len() + b.len() + batch * m * n) * 4 / 1024;
        assert!(windows > budget, "{m}x{k}x{n} fits one dispatch");
        let mut want = Vec::new();
        for i in 0..batch {
            let (ai, bi) = (&a[i * m * k..][..m * k], &b[i * k * n..][..k * n]);
            want.extend(matmul_ref(ai, bi, m, k, n));
        }
        let shape = |r, c| {
            if batch == 1 {
                vec![r, c]
            } else {
                vec![batch, r, c]
            }
        };
        let ta = Tensor::from_slice(&e, &a, &shape(m, k), "a").unwrap();
        let tb = Tensor::from_slice(&e, &b, &shape(k, n), "b").unwrap();
        let got = matmul::matmul(&ta, &tb).unwrap().to_vec().unwrap();
        let err = max_rel_err(&got, &want);
        assert!(err < 1e-4, "{batch}x{m}x{k}x{n}: rel err {err}");
        if batch == 1 {
            let at = Tensor::from_slice(&e, &transpose(&a, m, k), &[k, m], "at").unwrap();
            let bt = Tensor::from_slice(&e, &transpose(&b, k, n), &[n, k], "bt").unwrap();
            for (x, y, tx, ty) in [
                (&at, &tb, true, false),
                (&ta, &bt, false, true),
                (&at, &bt, true, true),
            ] {
                let got = matmul::matmul_ex(x, y, tx, ty, matmul::MatmulKernel::Tiled)
                    .unwrap()
                    .to_vec()
                    .unwrap();
                let err = max_rel_err(&got, &want);
                assert!(
                    err < 1e-4,
                    "{m}x{k}x{n} transposed {tx} {ty}: rel err {err}"
                );
            }
        }
    }
}

/// Products in windows against the f64 reference: odd sizes, windows
/// ending mid-row (a window is not a whole number of rows), both
/// transposes, batches, and one to many windows per operand.
#[test]
fn products_in_windows_match_f64() {
    // 1 KiB windows, then 1 KiB buffers (each operand crosses several).
    for limit in [Limit::Window(1024), Limit::Buffer(1024)] {
        products_match_f64(limit);
    }
}

fn products_match_f64(limit: Limit) {
    use common::{matmul_ref, max_rel_err, transpose, Rng, RngExt};
    use vramlab::ops::matmul;
    use vramlab::tensor::Tensor;
    // 1 KiB: 256 floats, so a 97-wide row is cut 2.6 rows in.
    let e = engine(limit);
    let mut rng = Rng::new(33);
    for &(batch, m, k, n) in &[
        (1, 1, 1, 1),
        (1, 9, 97, 13),
        (1, 31, 29, 37),
        (3, 11, 23, 19),
    ] {
        let a = rng.vec(batch * m * k);
        let b = rng.vec(batch * k * n);
        let mut want = Vec::new();
        for i in 0..batch {
            want.extend(matmul_ref(
                &a[i * m * k..(i + 1) * m * k],
                &b[i * k * n..(i + 1) * k * n],
                m,
                k,
                n,
            ));
        }
        let before = e.gpu().unwrap().windowed_dispatches();
        let (ta, tb) = if batch == 1 {
            // Stored transposed, asked for the transposes.
            let ta = Tensor::from_slice(&e, &transpose(&a, m, k), &[k, m], "at").unwrap();
            let tb = Tensor::from_slice(&e, &transpose(&b, k, n), &[n, k], "bt").unwrap();
            let got = matmul::matmul_ex(&ta, &tb, true, true, matmul::MatmulKernel::Tiled).unwrap();
            let err = max_rel_err(&got.to_vec().unwrap(), &want);
            assert!(
                err < 1e-4,
                "{limit:?} {m}x{k}x{n} transposed: rel err {err}"
            );
            (
                Tensor::from_slice(&e, &a, &[m, k], "a").unwrap(),
                Tensor::from_slice(&e, &b, &[k, n], "b").unwrap(),
            )
        } else {
            (
                Tensor::from_slice(&e, &a, &[batch, m, k], "a").unwrap(),
                Tensor::from_slice(&e, &b, &[batch, k, n], "b").unwrap(),
            )
        };
        let got = matmul::matmul(&ta, &tb).unwrap();
        let err = max_rel_err(&got.to_vec().unwrap(), &want);
        assert!(err < 1e-4, "{limit:?} {batch}x{m}x{k}x{n}: rel err {err}");
        let windowed = e.gpu().unwrap().windowed_dispatches() - before;
        if a.len().max(b.len()) * 4 > 1024 {
            assert!(
                windowed > 0,
                "{limit:?} {batch}x{m}x{k}x{n}: nothing was windowed"
            );
        }
    }
}
