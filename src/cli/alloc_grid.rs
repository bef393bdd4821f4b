//! `vramlab bench-alloc --grid`: the two strategies the engine runs
//! (`pytorch`, and `vramlab` as the engine has it: PyTorch's allocator with
//! vramlab's placement options, since wgpu cannot map pages for the lab's
//! `vramlab` strategy) on every zoo model (default sizes) × Adam and
//! SGD with momentum × batches 1…128, three training steps each on a
//! simulated device. The suite's seven workloads can flatter a strategy
//! tuned on them; the grid shows where it wins, ties and loses.

use crate::estimate::run::run_steps;
use crate::estimate::Plan;
use crate::memory::mib;
use crate::memory::AllocatorConfig;
use crate::nn::{ModelSpec, ZooEntry, ZOO};
use crate::tensor::Engine;
use crate::train::{Mode, OptimizerConfig, OptimizerKind};
use serde::Serialize;

const BATCHES: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
const STEPS: usize = 3;

#[derive(Serialize)]
struct Cell {
    model: &'static str,
    optimizer: &'static str,
    batch: usize,
    pytorch_reserved_bytes: u64,
    vramlab_reserved_bytes: u64,
    pytorch_device_allocs: i64,
    vramlab_device_allocs: i64,
}

impl Cell {
    fn outcome(&self) -> &'static str {
        use std::cmp::Ordering::*;
        match self
            .vramlab_reserved_bytes
            .cmp(&self.pytorch_reserved_bytes)
        {
            Less => "win",
            Equal => "tie",
            Greater => "LOSS",
        }
    }
}

/// Peak reserved and device allocations of `STEPS` steps under `config`.
fn measure(plan: &Plan, config: AllocatorConfig) -> anyhow::Result<(u64, i64)> {
    let engine = Engine::simulated(config, None);
    run_steps(engine.clone(), plan, 0, STEPS)?;
    let a = engine.allocator();
    Ok((a.max_memory_reserved(), a.stats().num_device_alloc))
}

pub fn run(json: bool) -> anyhow::Result<()> {
    let mut cells = Vec::new();
    for &ZooEntry { name: model, .. } in ZOO {
        for (optimizer, kind, momentum) in [
            ("adam", OptimizerKind::Adam, None),
            ("sgd", OptimizerKind::Sgd, Some(0.9)),
        ] {
            for batch in BATCHES {
                let plan = Plan {
                    model: ModelSpec::default_for(model).map_err(anyhow::Error::msg)?,
                    batch,
                    optimizer: OptimizerConfig::new(kind, None, momentum, None),
                    mode: Mode::Train,
                    amp: None,
                    dtype: crate::tensor::DType::F32,
                    loss: Default::default(),
                    config: AllocatorConfig::default(),
                };
                let (pr, pd) = measure(&plan, AllocatorConfig::default())?;
                let (vr, vd) = measure(&plan, crate::lab::strategies::vramlab::config())?;
                cells.push(Cell {
                    model,
                    optimizer,
                    batch,
                    pytorch_reserved_bytes: pr,
                    vramlab_reserved_bytes: vr,
                    pytorch_device_allocs: pd,
                    vramlab_device_allocs: vd,
                });
            }
        }
    }
    let count = |o: &str| cells.iter().filter(|c| c.outcome() == o).count();
    let (wins, ties, losses) = (count("win"), count("tie"), count("LOSS"));
    if json {
        let out = serde_json::json!({
            "steps": STEPS,
            "cells": cells,
            "wins": wins,
            "ties": ties,
            "losses": losses,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "peak reserved over {STEPS} training steps, pytorch vs vramlab (MiB; device allocations)"
    );
    println!(
        "  {:<12} {:<5} {:>5}  {:>15}  {:>15}",
        "model", "opt", "batch", "pytorch", "vramlab"
    );
    // Room for 3-digit device allocation counts (resnet50's).
    for c in &cells {
        println!(
            "  {:<12} {:<5} {:>5}  {:>9.1} ({:>3})  {:>9.1} ({:>3})  {}",
            c.model,
            c.optimizer,
            c.batch,
            mib(c.pytorch_reserved_bytes),
            c.pytorch_device_allocs,
            mib(c.vramlab_reserved_bytes),
            c.vramlab_device_allocs,
            c.outcome()
        );
    }
    println!("vramlab: {wins} wins, {ties} ties, {losses} losses");
    Ok(())
}
