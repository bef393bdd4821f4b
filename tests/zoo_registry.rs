//! The zoo is a registry: a model is one file that implements
//! `ModelConfig` and `Model`, plus one line that adds its entry. Such a model
//! gets everything the zoo's own get — flags, checks, parameter shapes read
//! off the simulated build, an estimate equal to the measured step.

use crate::common::engine;
use vramlab::estimate::run::estimate;
use vramlab::estimate::{analyze, run_step, Plan};
use vramlab::memory::AllocatorConfig;
use vramlab::nn::{ModelSpec, Sizes, Zoo, ZOO};
use vramlab::train::{Mode, OptimizerConfig, OptimizerKind};

#[path = "zoo_added/logistic.rs"]
mod logistic;

fn zoo() -> Zoo {
    let mut zoo = Zoo::standard();
    zoo.add(logistic::ENTRY); // the one registry line
    zoo
}

#[test]
fn an_added_model_is_named_sized_and_checked_like_the_zoos_own() {
    let zoo = zoo();
    assert_eq!(zoo.entries().len(), ZOO.len() + 1);
    assert!(
        ModelSpec::default_for("logistic").is_err(),
        "not in the standard zoo"
    );
    let mut spec = zoo.spec("logistic").unwrap();
    assert_eq!(spec.name(), "logistic");
    assert_eq!(
        spec.parameter_shapes(),
        vec![
            ("fc.weight".to_string(), vec![3, 12]),
            ("fc.bias".to_string(), vec![3])
        ]
    );
    let sizes = Sizes {
        dim: Some(40),
        classes: Some(7),
        ..Sizes::default()
    };
    spec.apply(&sizes).unwrap();
    assert_eq!(spec.parameter_count(), 40 * 7 + 7);
    assert_eq!(
        serde_json::to_value(&spec).unwrap(),
        serde_json::json!({"model": "logistic", "features": 40, "classes": 7})
    );
    let depth = Sizes {
        depth: Some(3),
        ..Sizes::default()
    };
    let err = spec.apply(&depth).unwrap_err().to_string();
    assert!(err.contains("--depth does not apply to logistic"), "{err}");
    let zero = Sizes {
        classes: Some(0),
        ..Sizes::default()
    };
    let err = spec.apply(&zero).unwrap_err().to_string();
    assert!(err.starts_with("logistic: --dim and --classes"), "{err}");
    let unknown = zoo.spec("logistics").unwrap_err().to_string();
    assert!(
        unknown.contains("logistic"),
        "lists the added model: {unknown}"
    );
}

#[test]
fn an_added_model_trains_and_its_estimate_is_its_measurement() {
    let plan = Plan {
        model: zoo().spec("logistic").unwrap(),
        batch: 5,
        optimizer: OptimizerConfig::new(OptimizerKind::Adam, None, None, None),
        mode: Mode::Train,
        amp: None,
        dtype: vramlab::tensor::DType::F32,
        loss: Default::default(),
        config: AllocatorConfig::default(),
    };
    let est = analyze(&estimate(&plan).unwrap().events, &[]);
    let measured = run_step(engine(), &plan, 0).unwrap();
    let m = analyze(&measured.events, &[]);
    assert!(m.peak_allocated_bytes > 0);
    assert_eq!(est.peak_allocated_bytes, m.peak_allocated_bytes);
    assert_eq!(est.by_category, m.by_category);
}

#[test]
fn parameter_counts_are_the_published_ones() {
    // Read off the simulated build: GPT-2 small (tied head) and
    // torchvision's resnet50 as their papers and model cards give them.
    let gpt2 = vramlab::nn::GptSpec::preset("gpt2").unwrap();
    assert_eq!(ModelSpec::from(gpt2).parameter_count(), 124_439_808);
    let resnet50 = ModelSpec::default_for("resnet50").unwrap();
    assert_eq!(resnet50.parameter_count(), 25_557_032);
}
