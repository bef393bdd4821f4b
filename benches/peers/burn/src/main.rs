//! vramlab against burn 0.22 (wgpu backend) on the same adapter, in one
//! process, interleaved rep by rep so both see the same machine state:
//! square matmuls (GFLOP/s) and the documents' SimpleConvNet training step
//! (batch 64, Adam, cross-entropy). Prints a table and, with `--json`, one
//! JSON object. Ratios are the figures to read; absolute times depend on
//! the machine.
//!
//! Each product row is timed two ways: one product and a wait for it (a
//! round trip to the device in every figure), and `--chain K` products
//! issued back to back with one wait (the device's rate, as a training
//! step keeps the queue full).
//!
//! `cargo run --release --manifest-path benches/peers/burn/Cargo.toml -- [--sizes 512,1024,2048] [--chain 8] [--reps 5] [--batch 64] [--json]`

use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::Distribution;
use std::time::Instant;
use vramlab::memory::AllocatorConfig;
use vramlab::nn::init::Rng;
use vramlab::nn::{ModelSpec, ParamStore};
use vramlab::tensor::{Engine, Tensor as VTensor};
use vramlab::train::{Batch, OptimizerConfig, OptimizerKind, Trainer};

#[derive(Module, Debug)]
struct SimpleConvNet {
    conv1: Conv2d,
    conv2: Conv2d,
    fc: Linear,
    relu: Relu,
}

impl SimpleConvNet {
    fn new(device: &Device) -> Self {
        SimpleConvNet {
            conv1: Conv2dConfig::new([3, 64], [3, 3]).init(device),
            conv2: Conv2dConfig::new([64, 128], [3, 3]).init(device),
            fc: LinearConfig::new(128 * 28 * 28, 10).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self.relu.forward(self.conv1.forward(x));
        let x = self.relu.forward(self.conv2.forward(x));
        self.fc.forward(x.flatten::<2>(1, 3))
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time(f: &mut dyn FnMut()) -> f64 {
    let t0 = Instant::now();
    f();
    t0.elapsed().as_secs_f64()
}

/// `f` run twice, the second timed: the two engines are two devices, so on
/// a GPU two contexts, and the first submission after the other's work
/// pays the switch between them (an H200 measured 1024³ at 10.7 TFLOP/s
/// alone and 1.2 beside burn, timing each first run).
fn time_second(f: &mut impl FnMut()) -> f64 {
    f();
    time(f)
}

struct Args {
    sizes: Vec<usize>,
    chain: usize,
    reps: usize,
    batch: usize,
    json: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        sizes: vec![512, 1024, 2048],
        chain: 8,
        reps: 5,
        batch: 64,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--sizes" => {
                a.sizes = value()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--chain" => a.chain = value()?.parse().map_err(|e| format!("--chain: {e}"))?,
            "--reps" => a.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--batch" => a.batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--json" => a.json = true,
            "--help" | "-h" => {
                return Err("usage: vramlab-peer-burn [--sizes 512,1024,2048] [--chain 8] [--reps 5] [--batch 64] [--json]\n  --chain K: also time K products issued back to back with one wait (1: only one product a wait)".into())
            }
            other => return Err(format!("unknown flag {other}; see --help")),
        }
    }
    if a.reps == 0 || a.batch == 0 || a.chain == 0 || a.sizes.contains(&0) {
        return Err("--reps, --batch, --chain and every size must be at least 1".into());
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let engine = Engine::new(&Default::default(), AllocatorConfig::default())?;
    let mut rng = Rng::new(3);
    // vramlab alone, before burn's device exists in this process: on a CPU
    // adapter burn's runtime keeps threads of its own, which the figures
    // measured beside it include.
    let n0 = args.sizes.iter().copied().max().unwrap_or(1024).min(1024);
    let alone = {
        let va = VTensor::from_slice(&engine, &rng.uniform(n0 * n0, 1.0), &[n0, n0], "a")?;
        let vb = VTensor::from_slice(&engine, &rng.uniform(n0 * n0, 1.0), &[n0, n0], "b")?;
        let mut run = || {
            drop(vramlab::ops::matmul::matmul(&va, &vb).expect("vramlab matmul"));
            engine.synchronize().expect("vramlab sync");
        };
        run();
        let t: Vec<f64> = (0..args.reps).map(|_| time(&mut run)).collect();
        2.0 * (n0 as f64).powi(3) / median(t) / 1e9
    };
    let device = Device::wgpu(DeviceKind::DefaultDevice);
    let mut rows = Vec::new();
    if !args.json {
        println!(
            "vramlab vs burn 0.22.1 (wgpu) on {} ({}); median of {} interleaved reps",
            engine.device_name(),
            engine.backend_name(),
            args.reps
        );
    }
    if !args.json {
        println!(
            "matmul {n0:>5}³: vramlab {alone:>8.2} GFLOP/s alone, before burn's device exists"
        );
    }
    for &n in &args.sizes {
        let flops = 2.0 * (n as f64).powi(3);
        let a = Tensor::<2>::random([n, n], Distribution::Default, &device);
        let b = Tensor::<2>::random([n, n], Distribution::Default, &device);
        let va = VTensor::from_slice(&engine, &rng.uniform(n * n, 1.0), &[n, n], "a")?;
        let vb = VTensor::from_slice(&engine, &rng.uniform(n * n, 1.0), &[n, n], "b")?;
        // `k` products issued back to back, all kept until the one wait (a
        // result dropped before it could let an engine skip or reuse work).
        let burn_run = |k: usize| {
            let cs: Vec<_> = (0..k).map(|_| a.clone().matmul(b.clone())).collect();
            device.sync().expect("burn sync");
            drop(cs);
        };
        let vram_run = |k: usize| {
            let cs: Vec<_> = (0..k)
                .map(|_| vramlab::ops::matmul::matmul(&va, &vb).expect("vramlab matmul"))
                .collect();
            engine.synchronize().expect("vramlab sync");
            drop(cs);
        };
        burn_run(1);
        vram_run(1);
        let chains: Vec<usize> = if args.chain > 1 {
            vec![1, args.chain]
        } else {
            vec![1]
        };
        for k in chains {
            let (mut tb, mut tv) = (Vec::new(), Vec::new());
            for _ in 0..args.reps {
                tb.push(time_second(&mut || burn_run(k)));
                tv.push(time_second(&mut || vram_run(k)));
            }
            let work = flops * k as f64;
            let (gb, gv) = (work / median(tb) / 1e9, work / median(tv) / 1e9);
            if !args.json {
                let how = if k == 1 {
                    "one a wait".to_string()
                } else {
                    format!("{k} a wait")
                };
                println!(
                    "matmul {n:>5}³ ({how:>10}): vramlab {gv:>8.2} GFLOP/s  burn {gb:>8.2} GFLOP/s  vramlab/burn {:.2}×",
                    gv / gb
                );
            }
            rows.push(serde_json::json!({"what": "matmul", "n": n, "chain": k,
                "vramlab_gflops": gv, "burn_gflops": gb, "ratio": gv / gb}));
        }
    }

    // SimpleConvNet step, batch N, Adam lr 1e-3, cross-entropy.
    let ad = device.clone().autodiff();
    let mut model = SimpleConvNet::new(&ad);
    let mut optim = AdamConfig::new().init();
    let ce = CrossEntropyLossConfig::new().init(&ad);
    let x = Tensor::<4>::random([args.batch, 3, 32, 32], Distribution::Normal(0.0, 1.0), &ad);
    let labels: Vec<i64> = (0..args.batch as i64).map(|i| i % 10).collect();
    let y = Tensor::<1, Int>::from_data(TensorData::new(labels, [args.batch]), &ad);
    let mut burn_step = || {
        let loss = ce.forward(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model.clone(), grads);
        ad.sync().expect("burn sync");
    };
    let spec = ModelSpec::default_for("simple-cnn")?;
    let mut store = ParamStore::new();
    let vmodel = spec.build(&engine, &mut store, &mut rng)?;
    let batch = Batch::random(&engine, &mut rng, args.batch, &spec.input_shape(), 10)?;
    let opt = OptimizerConfig::new(OptimizerKind::Adam, None, None, None).build();
    let mut trainer = Trainer::new(engine.clone(), vmodel, store, opt, false);
    let mut vram_step = || {
        trainer.step(&batch).expect("vramlab step");
        engine.synchronize().expect("vramlab sync");
    };
    burn_step();
    vram_step();
    let (mut tb, mut tv) = (Vec::new(), Vec::new());
    for _ in 0..args.reps {
        tb.push(time_second(&mut burn_step));
        tv.push(time_second(&mut vram_step));
    }
    let (sb, sv) = (median(tb.clone()), median(tv.clone()));
    if !args.json {
        println!(
            "SimpleConvNet Adam step, batch {}: vramlab {:.1} ms  burn {:.1} ms  burn/vramlab {:.2}× (vramlab faster by this)",
            args.batch,
            sv * 1e3,
            sb * 1e3,
            sb / sv
        );
    }
    rows.push(
        serde_json::json!({"what": "simple-cnn step", "batch": args.batch,
        "vramlab_seconds": sv, "burn_seconds": sb, "vramlab_all": tv, "burn_all": tb,
        "speedup": sb / sv}),
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "adapter": engine.device_name(),
                "backend": engine.backend_name(),
                "reps": args.reps,
                "vramlab_alone_gflops": {"n": n0, "gflops": alone},
                "rows": rows,
            }))?
        );
    }
    Ok(())
}
