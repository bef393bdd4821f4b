//! The model a layout shards: GPT-2's architecture (nanoGPT's layout, as
//! vramlab's `gpt` model: tied head, biases, two LayerNorms a block), its
//! parameters by module, and what one tensor-parallel rank holds of each.

use serde::Serialize;

/// A decoder-only transformer of `layers` GPT-2 blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Transformer {
    pub layers: u64,
    pub heads: u64,
    pub hidden: u64,
    /// Rows of the position table (the longest sequence it takes).
    pub positions: u64,
    pub vocab: u64,
}

/// A leaf module's parameters on one tensor-parallel rank: tensors, and
/// elements in all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Module {
    pub name: &'static str,
    /// Element counts of its parameter tensors (weight first).
    pub tensors: Vec<u64>,
}

impl Module {
    pub fn numel(&self) -> u64 {
        self.tensors.iter().sum()
    }
}

impl Transformer {
    /// One block's leaf modules as tensor-parallel rank of `t` holds them
    /// (Megatron's split): q, k, v and the MLP's first linear by columns
    /// (weights and biases split), both output projections by rows (their
    /// biases whole), LayerNorms whole.
    pub fn block_modules(&self, t: u64) -> Vec<Module> {
        let h = self.hidden;
        let m = |name, tensors: Vec<u64>| Module { name, tensors };
        vec![
            m("ln_1", vec![h, h]),
            m("attn.q", vec![h * h / t, h / t]),
            m("attn.k", vec![h * h / t, h / t]),
            m("attn.v", vec![h * h / t, h / t]),
            m("attn.c_proj", vec![h * h / t, h]),
            m("ln_2", vec![h, h]),
            m("mlp.c_fc", vec![4 * h * h / t, 4 * h / t]),
            m("mlp.c_proj", vec![4 * h * h / t, h]),
        ]
    }

    /// The modules outside the blocks that pipeline stage `stage` of `p`
    /// holds: the token table (split by vocabulary rows, the last rank's
    /// share padded as Megatron pads the vocabulary) and the position
    /// table on the first stage; the final LayerNorm and, where there are
    /// several stages, a copy of the token table for the tied head
    /// (Megatron keeps one on the last stage) on the last.
    pub fn outer_modules(&self, t: u64, stage: u64, p: u64) -> (Vec<Module>, Vec<Module>) {
        let h = self.hidden;
        let mut first = vec![];
        let mut last = vec![];
        if stage == 0 {
            first.push(Module {
                name: "wte",
                tensors: vec![self.vocab.div_ceil(t) * h],
            });
            first.push(Module {
                name: "wpe",
                tensors: vec![self.positions * h],
            });
        }
        if stage + 1 == p {
            last.push(Module {
                name: "ln_f",
                tensors: vec![h, h],
            });
            if p > 1 {
                last.push(Module {
                    name: "wte (tied head copy)",
                    tensors: vec![self.vocab.div_ceil(t) * h],
                });
            }
        }
        (first, last)
    }

    /// Parameters in one block: 12h² + 13h.
    pub fn block_params(&self) -> u64 {
        self.block_modules(1).iter().map(Module::numel).sum()
    }

    /// Every parameter of the whole model (the tied head counted once).
    pub fn params(&self) -> u64 {
        let h = self.hidden;
        self.layers * self.block_params() + (self.vocab + self.positions) * h + 2 * h
    }

    /// Parameters that pipeline stage `stage` of `p`, tensor rank of `t`,
    /// holds (before any data-parallel sharding).
    pub fn stage_params(&self, t: u64, stage: u64, p: u64) -> u64 {
        let per_block: u64 = self.block_modules(t).iter().map(Module::numel).sum();
        let (first, last) = self.outer_modules(t, stage, p);
        let outer: u64 = first.iter().chain(&last).map(Module::numel).sum();
        self.layers / p * per_block + outer
    }

    /// The largest leaf module's parameters (DeepSpeed's
    /// `largest_layer_params`: a module's own parameters, not its
    /// children's).
    pub fn largest_module(&self) -> u64 {
        let (first, last) = self.outer_modules(1, 0, 1);
        self.block_modules(1)
            .iter()
            .chain(&first)
            .chain(&last)
            .map(Module::numel)
            .max()
            .unwrap_or(0)
    }
}
