//! Helpers shared by the GPU tests: a seeded generator and f64 references.
#![allow(dead_code)]

pub mod cli;
pub mod files;

pub use cli::{json_of, vramlab_json};

use vramlab::device::AdapterOptions;
use vramlab::memory::AllocatorConfig;
use vramlab::tensor::Engine;

/// The library's seeded generator (SplitMix64), so failures reproduce.
pub use vramlab::nn::init::Rng;

/// Test shorthands on top of the library's generator.
pub trait RngExt {
    /// `n` values uniform in [-1, 1).
    fn vec(&mut self, n: usize) -> Vec<f32>;
}

impl RngExt for Rng {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        self.uniform(n, 1.0)
    }
}

/// The zoo models at test sizes (small enough to run every mode and
/// dtype on lavapipe in seconds).
pub fn small(name: &str) -> vramlab::nn::ModelSpec {
    use vramlab::nn::ModelSpec;
    match name {
        "mlp" => ModelSpec::from(vramlab::nn::MlpSpec {
            widths: vec![50, 64, 64, 64, 10],
            checkpoint_every: 0,
        }),
        "resnet-mini" => ModelSpec::from(vramlab::nn::ResnetMiniSpec {
            width: 4,
            depth: 3,
            resolution: 16,
            classes: 10,
        }),
        "attention" => ModelSpec::from(vramlab::nn::AttentionSpec {
            seq_len: 24,
            dim: 16,
            hidden: 32,
            classes: 5,
        }),
        "resnet50" => ModelSpec::from(vramlab::nn::Resnet50Spec {
            depth: 50,
            width: 4,
            resolution: 32,
            classes: 5,
        }),
        "gpt" => ModelSpec::from(vramlab::nn::GptSpec {
            config: vramlab::nn::gpt::GptConfig {
                layers: 2,
                heads: 2,
                dim: 16,
                seq_len: 12,
                vocab: 20,
            },
            seq: 12,
            dropout: 0.0,
        }),
        other => ModelSpec::default_for(other).unwrap(),
    }
}

/// f64 reference linear: x [n, i] · w [o, i]ᵀ + b [o] → [n, o].
pub fn linear_ref(x: &[f64], w: &[f64], b: &[f64], n: usize, i: usize, o: usize) -> Vec<f64> {
    let mut y = vec![0.0; n * o];
    for r in 0..n {
        for c in 0..o {
            y[r * o + c] = b[c] + (0..i).map(|k| x[r * i + k] * w[c * i + k]).sum::<f64>();
        }
    }
    y
}

/// Norm-wise relative distance ‖got − want‖ / ‖want‖ (element-wise relative
/// error is meaningless for 16-bit results: an element near zero carries
/// the absolute rounding error of its larger neighbours).
pub fn normwise(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let d: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum();
    let n: f64 = want.iter().map(|w| w * w).sum();
    (d / n.max(1e-300)).sqrt()
}

/// `got` thinned as a PyTorch fixture thinned tensor `name`
/// (`stride.<name>` in its metadata: every k-th element of large tensors).
pub fn thin(expected: &vramlab::io::SafeTensors, name: &str, got: &[f32]) -> Vec<f32> {
    match expected.metadata.get(&format!("stride.{name}")) {
        Some(k) => got.iter().step_by(k.parse().unwrap()).copied().collect(),
        None => got.to_vec(),
    }
}

/// An engine on whatever adapter this machine has (lavapipe in CI).
pub fn engine() -> Engine {
    engine_with(AllocatorConfig::default())
}

/// An engine that leaves native f16 unused: f16 packed two per word and
/// computed in f32, as on adapters without SHADER_F16.
pub fn engine_without_native_f16() -> Engine {
    let options = AdapterOptions {
        without_shader_f16: true,
        ..adapter_options()
    };
    engine_from(&options, AllocatorConfig::default())
}

/// The adapter options every test engine uses: the adapter's own limits,
/// or windows of `VRAMLAB_TEST_BINDING_WINDOW` bytes and buffers of
/// `VRAMLAB_TEST_BUFFER_LIMIT` bytes (to run any test with its tensors in
/// many windows, or its segments in many buffers; CI does not set them).
pub fn adapter_options() -> AdapterOptions {
    let bytes = |name: &str| {
        std::env::var(name).ok().map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} is a number of bytes"))
        })
    };
    AdapterOptions {
        binding_limit: bytes("VRAMLAB_TEST_BINDING_WINDOW"),
        buffer_limit: bytes("VRAMLAB_TEST_BUFFER_LIMIT"),
        ..AdapterOptions::default()
    }
}

pub fn engine_with(config: AllocatorConfig) -> Engine {
    engine_from(&adapter_options(), config)
}

/// An engine with these options; a test without an adapter fails saying so.
pub fn engine_from(options: &AdapterOptions, config: AllocatorConfig) -> Engine {
    Engine::new(options, config).unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"))
}

/// Largest relative error, measured against max(|ref|, 1e-2 * scale) so tiny
/// reference values near zero do not blow the ratio up.
pub fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs() / w.abs().max(1e-2 * scale))
        .fold(0.0, f64::max)
}

/// f64 reference matmul of row-major [m,k]·[k,n].
pub fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p] as f64;
            for j in 0..n {
                c[i * n + j] += av * b[p * n + j] as f64;
            }
        }
    }
    c
}

pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// f64 reference conv2d: x [n,c,h,w], w [o,c,kh,kw], b [o] → [n,o,ho,wo].
#[allow(clippy::too_many_arguments)]
pub fn conv2d_ref(
    x: &[f64],
    w: &[f64],
    b: &[f64],
    (n, c, h, wd): (usize, usize, usize, usize),
    (o, kh, kw): (usize, usize, usize),
    stride: usize,
    pad: usize,
) -> (Vec<f64>, usize, usize) {
    let ho = (h + 2 * pad - kh) / stride + 1;
    let wo = (wd + 2 * pad - kw) / stride + 1;
    let mut y = vec![0.0; n * o * ho * wo];
    for ni in 0..n {
        for oi in 0..o {
            for oy in 0..ho {
                for ox in 0..wo {
                    let mut acc = b[oi];
                    for ci in 0..c {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * stride + ky) as isize - pad as isize;
                                let ix = (ox * stride + kx) as isize - pad as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    acc += x[((ni * c + ci) * h + iy as usize) * wd + ix as usize]
                                        * w[((oi * c + ci) * kh + ky) * kw + kx];
                                }
                            }
                        }
                    }
                    y[((ni * o + oi) * ho + oy) * wo + ox] = acc;
                }
            }
        }
    }
    (y, ho, wo)
}

pub fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Mean cross-entropy in f64.
pub fn cross_entropy_ref(logits: &[f64], labels: &[usize], classes: usize) -> f64 {
    let n = labels.len();
    let mut total = 0.0;
    for r in 0..n {
        let row = &logits[r * classes..(r + 1) * classes];
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        total += lse - row[labels[r]];
    }
    total / n as f64
}

/// Central finite-difference gradient of a scalar f at x, in f64.
pub fn numeric_grad(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-6;
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            let orig = xp[i];
            xp[i] = orig + h;
            let fp = f(&xp);
            xp[i] = orig - h;
            let fm = f(&xp);
            xp[i] = orig;
            (fp - fm) / (2.0 * h)
        })
        .collect()
}

/// One forward, cross-entropy and backward of `model` on `batch` (plain or
/// checkpointed), from zeroed gradients: every parameter's gradient.
pub fn grads_of(
    model: &dyn vramlab::nn::Model,
    store: &mut vramlab::nn::ParamStore,
    batch: &vramlab::train::Batch,
    checkpointed: bool,
) -> Vec<Vec<f32>> {
    grads_under(model, store, batch, checkpointed, None)
}

/// `grads_of` with the forward under autocast to `amp`, if given.
pub fn grads_under(
    model: &dyn vramlab::nn::Model,
    store: &mut vramlab::nn::ParamStore,
    batch: &vramlab::train::Batch,
    checkpointed: bool,
    amp: Option<vramlab::tensor::DType>,
) -> Vec<Vec<f32>> {
    let fused = vramlab::train::LossMode::Fused;
    loss_and_grads(model, store, batch, checkpointed, amp, fused).1
}

/// One forward (under autocast to `amp`, if given), `loss` and backward of
/// `model` on `batch` from zeroed gradients: the loss and every
/// parameter's gradient.
pub fn loss_and_grads(
    model: &dyn vramlab::nn::Model,
    store: &mut vramlab::nn::ParamStore,
    batch: &vramlab::train::Batch,
    checkpointed: bool,
    amp: Option<vramlab::tensor::DType>,
    loss: vramlab::train::LossMode,
) -> (f32, Vec<Vec<f32>>) {
    use vramlab::autograd::{Tape, Value};
    store.zero_grad();
    let tape = Tape::new();
    let x = Value::constant(batch.x.clone());
    let forward = || {
        loss.forward(&tape, model, store, &x, checkpointed, &batch.labels, None)
            .unwrap()
            .1
    };
    let l = match amp {
        Some(d) => tape.autocast(d, forward),
        None => forward(),
    };
    tape.backward(&l, store).unwrap();
    let grads = store
        .iter()
        .map(|p| p.grad.as_ref().unwrap().to_vec().unwrap())
        .collect();
    (l.tensor().to_vec().unwrap()[0], grads)
}

/// The first Chromium on PATH (scripts/test.sh installs Debian's).
pub fn chromium() -> &'static str {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            std::process::Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("this test needs Chromium: apt-get install -y chromium (scripts/test.sh does)")
}

/// `page` loaded in headless Chromium: its DOM after the scripts ran,
/// asserting the page's self-check finished (`data-status="ok"`).
pub fn rendered_dom(page: &std::path::Path) -> String {
    let out = std::process::Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains(r#"data-status="ok""#),
        "{} did not finish drawing: {}",
        page.display(),
        &dom[..dom.len().min(300)]
    );
    dom
}

/// What one forward (+ cross-entropy) of `spec` at `batch` saves for
/// backward, each storage once, parameters left out, summed by the part of
/// the model (`part_of` maps the saving op's scope to a part) — what
/// PyTorch's saved_tensors_hooks count gives on the other side. On a
/// simulated device: the bytes depend on shapes only.
pub fn saved_bytes_by_part(
    spec: &vramlab::nn::ModelSpec,
    batch: usize,
    part_of: fn(&str) -> String,
) -> std::collections::BTreeMap<String, u64> {
    use vramlab::autograd::{functions as f, Tape, Value};
    use vramlab::memory::Category;
    let engine = Engine::simulated(AllocatorConfig::default(), None);
    let mut store = vramlab::nn::ParamStore::new();
    let model = spec.build(&engine, &mut store, &mut Rng::new(0)).unwrap();
    let b = vramlab::train::Batch::random_for(
        &engine,
        &mut Rng::new(1),
        spec,
        batch,
        vramlab::tensor::DType::F32,
    )
    .unwrap();
    let tape = Tape::new();
    engine.start_saved_log();
    let _fwd = engine.scope(Category::Output, "forward");
    let logits = model
        .forward(&tape, &store, &Value::constant(b.x.clone()))
        .unwrap();
    let _loss = f::cross_entropy(&tape, &logits, &b.labels).unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut parts = std::collections::BTreeMap::new();
    for t in engine.take_saved_log() {
        if t.category == Category::Parameter || !seen.insert(t.block) {
            continue;
        }
        *parts.entry(part_of(&t.scope)).or_insert(0) += t.bytes;
    }
    parts
}
