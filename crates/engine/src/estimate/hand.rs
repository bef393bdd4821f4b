//! The documents' hand method (seed 002, claim C26): the sum of parameters,
//! gradients, optimizer state, every layer's output and the input, in f32 —
//! and what it leaves out, measured.

use super::analysis::Analysis;
use crate::train::{Mode, OptimizerConfig, OptimizerKind};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct HandMethod {
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    pub input: u64,
    pub layer_outputs: u64,
    pub total: u64,
}

/// `layers_with_parameters`: the model's parameterised layers (conv,
/// linear), whose outputs the method counts — not the ReLU outputs between
/// them.
pub fn hand_method(
    layers_with_parameters: &[String],
    parameters: usize,
    input_elements: usize,
    analysis: &Analysis,
    optimizer: &OptimizerConfig,
    mode: Mode,
    bytes_per_element: u64,
) -> HandMethod {
    let p = parameters as u64 * bytes_per_element;
    let training = mode != Mode::Inference;
    let state_copies = match optimizer.kind {
        OptimizerKind::Adam | OptimizerKind::Adamw => 2,
        OptimizerKind::Sgd if optimizer.momentum != 0.0 => 1,
        OptimizerKind::Sgd => 0,
    };
    let outputs: u64 = analysis
        .layers
        .iter()
        .filter(|l| layers_with_parameters.contains(&l.layer))
        .map(|l| l.output_shape.iter().product::<usize>() as u64 * bytes_per_element)
        .sum();
    let h = HandMethod {
        parameters: p,
        gradients: if training { p } else { 0 },
        optimizer_state: if training { state_copies * p } else { 0 },
        input: input_elements as u64 * bytes_per_element,
        layer_outputs: outputs,
        total: 0,
    };
    HandMethod {
        total: h.parameters + h.gradients + h.optimizer_state + h.input + h.layer_outputs,
        ..h
    }
}
